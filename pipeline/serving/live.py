"""The versions a running server serves, kept in its run folder, and what its workers say.

`pipeline rollout` and `pipeline rollback` write the wanted state; every worker of the
server watches the file, loads and unloads versions to match it, and answers with an
acknowledgement naming the state's generation (or why it could not). A worker the
supervisor restarts reads the same file before it serves, so it comes back with the
versions and the traffic split in force, not the ones the server started with.

    <run_dir>/live-versions.json     the wanted state (generation, per served model:
                                     its loaded versions, default, canary and share)
    <run_dir>/live/ack-<slot>.json   a worker's applied generation, or its error
    <run_dir>/live/stats-<slot>.json a worker's answers per version: count, failed,
                                     recent latencies (the canary's error rate and p99)

The control channel is the run folder itself: only its owner can write there, and no
network route changes what is served, so no inference token can (SECURITY.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.fileio import write_json

# The response header TorchServe's gateway names the answering version in (OIP answers carry
# `model_version` in their JSON instead).
VERSION_HEADER = "X-Model-Version"
log = logging.getLogger(__name__)

STATE = "live-versions.json"
FOLDER = "live"
RECENT = 2000  # latencies a worker keeps per version for the p99


class LiveError(PipelineError):
    """The server did not apply a state: a worker failed to load a version, or timed out."""


@dataclass(frozen=True)
class Loaded:
    """One version a server holds: its export folder and the format it serves from it."""

    version: int
    export_dir: str
    format: str


@dataclass
class ModelVersions:
    """One served model's versions and where its unversioned requests go."""

    versions: dict[int, Loaded]
    default: int
    canary: int | None = None
    percent: float = 0.0  # of unversioned requests to the canary

    def to_json(self) -> dict[str, Any]:
        return {
            "versions": {str(k): vars(v) for k, v in sorted(self.versions.items())},
            "default": self.default,
            "canary": self.canary,
            "percent": self.percent,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelVersions:
        loaded = {int(k): Loaded(**v) for k, v in data["versions"].items()}
        return cls(loaded, int(data["default"]), data.get("canary"), float(data["percent"]))


@dataclass
class LiveState:
    generation: int
    models: dict[str, ModelVersions] = field(default_factory=dict)  # by served name

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "models": {k: v.to_json() for k, v in sorted(self.models.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LiveState:
        models = {k: ModelVersions.from_json(v) for k, v in data["models"].items()}
        return cls(int(data["generation"]), models)


class Splitter:
    """Sends `percent` of calls to the canary, spread evenly (every fifth call at 20%),
    so a short run gets its share exactly instead of by chance."""

    def __init__(self) -> None:
        self._credit = 0.0

    def to_canary(self, percent: float) -> bool:
        self._credit += percent / 100.0
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            return True
        return False


def read(run_dir: Path) -> LiveState | None:
    path = Path(run_dir) / STATE
    try:
        return LiveState.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LiveError(f"{path} is unreadable ({err}).") from None


def clear(run_dir: Path) -> None:
    """Forget an earlier run's state, acknowledgements and tallies (a fresh start)."""
    (Path(run_dir) / STATE).unlink(missing_ok=True)
    shutil.rmtree(Path(run_dir) / FOLDER, ignore_errors=True)


def write(run_dir: Path, state: LiveState) -> None:
    write_json(Path(run_dir) / STATE, state.to_json())


def ack(run_dir: Path, slot: int, generation: int, error: str | None = None) -> None:
    write_json(
        Path(run_dir) / FOLDER / f"ack-{slot}.json",
        {"generation": generation, "error": error, "at": time.time()},
    )


def acks(run_dir: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for path in (Path(run_dir) / FOLDER).glob("ack-*.json"):
        try:
            found[int(path.stem.removeprefix("ack-"))] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced: read again on the next poll
    return found


def wait_applied(run_dir: Path, generation: int, workers: int, timeout_s: float = 180.0) -> None:
    """Return once every worker (slots 0..workers-1) has applied `generation`; LiveError
    naming the first worker that could not, or the ones still behind at `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = acks(run_dir)
        for slot in range(workers):
            a = got.get(slot)
            if a and a.get("generation") == generation and a.get("error"):
                raise LiveError(f"worker {slot} could not apply the change: {a['error']}")
        behind = [s for s in range(workers) if got.get(s, {}).get("generation", -1) < generation]
        if not behind:
            return
        if time.monotonic() > deadline:
            raise LiveError(
                f"worker(s) {behind} had not applied generation {generation} after "
                f"{timeout_s:.0f} s; see the server's logs in {Path(run_dir) / 'logs'}."
            )
        time.sleep(0.05)


@dataclass
class Tally:
    """One version's answers on one worker: how many, how many failed (5xx), and the most
    recent latencies in ms."""

    requests: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def add(self, ms: float, ok: bool) -> None:
        self.requests += 1
        self.failed += 0 if ok else 1
        self.latencies_ms.append(round(ms, 3))
        if len(self.latencies_ms) > RECENT:
            del self.latencies_ms[: len(self.latencies_ms) - RECENT]

    def merge(self, other: Tally) -> None:
        self.requests += other.requests
        self.failed += other.failed
        self.latencies_ms += other.latencies_ms

    def p99_ms(self) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0


def write_stats(run_dir: Path, slot: int, tallies: Mapping[tuple[str, int], Tally]) -> None:
    write_json(
        Path(run_dir) / FOLDER / f"stats-{slot}.json",
        {f"{name}@{version}": vars(t) for (name, version), t in tallies.items()},
    )


def read_stats(run_dir: Path, slot: int | None = None) -> dict[tuple[str, int], Tally]:
    """Every worker's tallies (or `slot`'s alone), summed per (served name, version)."""
    total: dict[tuple[str, int], Tally] = {}
    pattern = f"stats-{'*' if slot is None else slot}.json"
    for path in (Path(run_dir) / FOLDER).glob(pattern):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for key, value in data.items():
            name, _, version = key.rpartition("@")
            total.setdefault((name, int(version)), Tally()).merge(Tally(**value))
    return total


def _carried(run_dir: Path, slot: int) -> tuple[int | None, dict[tuple[str, int], Tally]]:
    """What an earlier process of `slot` (a worker the supervisor restarted) acknowledged
    and counted: its answers count toward the canary's judgement after it died too."""
    generation = acks(run_dir).get(slot, {}).get("generation")
    return generation, read_stats(run_dir, slot) if generation is not None else {}


async def follow(
    run_dir: Path,
    slot: int,
    tallies: MutableMapping[tuple[str, int], Tally],
    apply: Callable[[LiveState], Awaitable[str | None]],
    *,
    poll_s: float = 0.1,
    stats_every_s: float = 0.5,
) -> None:
    """A serving process's side of the live state, run for as long as it serves: each new
    state file goes to `apply` (which returns why it could not, or None) and is then
    acknowledged as `slot`; `tallies` are written whenever they changed (at most every
    `stats_every_s`). The KServe runtime's workers, TorchServe's gateway and the toy run it."""
    seen: tuple[int, int, int] | None = None
    # A restarted worker wrote empty tallies over its predecessor's: a canary judged after
    # the restart had "answered 0 of the 20 requests", its failures before it lost too.
    before, counted = _carried(run_dir, slot)
    written: dict[tuple[str, int], int] | None = None
    last_stats = 0.0
    while True:
        try:
            found = (Path(run_dir) / STATE).stat()
            # Each write is a new file renamed into place: a new inode, even within one tick.
            stamp: tuple[int, int, int] | None = (found.st_ino, found.st_mtime_ns, found.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp != seen:
            seen = stamp
            try:
                state = read(run_dir)
            except LiveError:
                log.exception("cannot read the live state")
                state = None
            if state is not None:
                try:
                    error = await apply(state)
                except Exception as err:  # the process must outlive one bad state
                    log.exception("applying generation %d failed", state.generation)
                    error = f"{type(err).__name__}: {err}"
                if before == state.generation and error is None:  # the same state again
                    for key, tally in counted.items():
                        tallies.setdefault(key, Tally()).merge(tally)
                before, counted = None, {}
                # The tallies as this state left them (a version loaded again starts from
                # none), before the acknowledgement: a rollout that judges a canary right
                # after read its previous incarnation's answers, up to stats_every_s old.
                write_stats(run_dir, slot, tallies)
                written, last_stats = {k: t.requests for k, t in tallies.items()}, time.monotonic()
                ack(run_dir, slot, state.generation, error)
        counts = {k: t.requests for k, t in tallies.items()}
        if counts != written and time.monotonic() - last_stats >= stats_every_s:
            write_stats(run_dir, slot, tallies)
            written, last_stats = counts, time.monotonic()
        await asyncio.sleep(poll_s)
