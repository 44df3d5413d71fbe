"""A running server as `pipeline serve` recorded it in `<run_dir>/server.json`, and `stop()`.

The record is what every client of the server starts from (infer, verify's
served backends, loadtest, bench, stop): its URLs, the processes to
recognise and signal, the token files, and which model and format each
served name holds (`ServedInfo`, pipeline.serving.provenance).

Every runtime writes the inference token to `inference_key.json` in its run folder,
the file inference clients read; a runtime with other keys (TorchServe's management
key) records their files by API in `key_files`, so `keys()` finds them without
knowing the runtime.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import psutil

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.formats import base as registry
from pipeline.serving.names import BUILTIN
from pipeline.serving.provenance import ServedInfo

SERVER_FILE = "server.json"
INFERENCE_KEY_FILE = "inference_key.json"  # the inference key alone, for clients
log = logging.getLogger(__name__)


class ServeError(PipelineError):
    """A server could not be started, reached or stopped."""


def default_run_dir() -> Path:
    return paths.artifacts_root() / "serve"


def run_dir_flag(run_dir: Path | str) -> str:
    """ " --run-dir DIR" for a hint a user copies, when DIR is not the default one (a hint
    without it would act on the default's server); "" when it is."""
    if Path(run_dir).resolve() == default_run_dir().resolve():
        return ""
    return f" --run-dir {run_dir}"


def store_flag(store: Path | str) -> str:
    """ " --store DIR" for a hint a user copies, when DIR is not the default store."""
    return "" if Path(store) == paths.DEFAULT_STORE else f" --store {store}"


def option_values(options: list[str], flag: str) -> list[str]:
    """Every value of `flag` in a recorded command line (`--flag V` and `--flag=V`)."""
    spaced = [options[i + 1] for i, o in enumerate(options[:-1]) if o == flag]
    return spaced + [o.split("=", 1)[1] for o in options if o.startswith(flag + "=")]


def serve_options(server: Server | None) -> list[str]:
    """The options of the `pipeline serve` command `server` was started with ([] when it
    recorded none)."""
    command = server.command if server is not None else []
    return command[command.index("serve") + 1 :] if "serve" in command else []


def restart_command(
    server: Server | None, fallback: str, *, before: str = "", adding: Sequence[str] = ()
) -> str:
    """The command that stops `server` and starts it again as it was started: `pipeline
    stop` of its run folder, then its recorded serve command, `adding` after its options
    (a model it must serve too, an option whose value came from the environment).
    `before` (TorchServe's `archive ...`) runs first, into the server's store. `fallback`
    when the server recorded no command (records from before it did, or no server)."""
    if server is None or "serve" not in server.command:
        return f"pipeline {before} && {fallback}" if before else fallback
    options = serve_options(server)
    steps = [
        f"pipeline stop{run_dir_flag(server.run_dir)}",
        shlex.join(["pipeline", *server.command, *adding]),
    ]
    if before:
        store = next(iter(option_values(options, "--store")[::-1]), None)
        steps.insert(0, f"pipeline {before}{store_flag(store) if store else ''}")
    return " && ".join(steps)


@dataclass(frozen=True)
class Server:
    """A running server of any runtime, as recorded in server.json: what runs (`runtime`),
    where (its URLs), its processes, its key files (in `run_dir`), and what it serves with
    its provenance. What only one runtime has is in `extras`."""

    runtime: str  # its name in pipeline.serving.runtime's registry
    pid: int  # the main process; its process group holds what it starts
    run_dir: str
    inference_url: str
    metrics_url: str
    models: list[str]  # the served names (the names requests address)
    started: float = 0.0  # the main process's creation time (psutil)
    # Other process groups the runtime started, by role ({"gateway": pid}).
    pids: dict[str, int] = field(default_factory=dict)
    # The files (in run_dir) on the command line of the runtime's processes: how `alive()`
    # and `stop` recognise them (the runtime's Runtime.markers).
    markers: list[str] = field(default_factory=list)
    # For HTTPS: the certificate clients trust (the server's own, for a self-signed one).
    ca_file: str | None = None
    failed: list[str] = field(default_factory=list)  # models that did not load (keep_going)
    # served name → what it holds and where it came from (pipeline.serving.provenance)
    served: dict[str, ServedInfo] = field(default_factory=dict)
    # API → the file in run_dir holding its key, beyond inference_key.json (TorchServe's
    # management key); each file is a JSON object {api: {"key": ...}}.
    key_files: dict[str, str] = field(default_factory=dict)
    # Per runtime: TorchServe's management_url and backend_url (its own inference API
    # behind the gateway), the KServe runtime's grpc_url.
    extras: dict[str, str] = field(default_factory=dict)
    # The public keys `serve --trust` gave it: its workers check a version they load
    # against these and the store's trust folder, so a rollout checks with them too.
    trust: list[str] = field(default_factory=list)
    # The keys each store's trust policy held as it started (signing.pins): its workers
    # trust at most those.
    pins: dict[str, list[str]] = field(default_factory=dict)
    # The `pipeline` arguments that started it (serve's command line, global options
    # first): a hint that restarts it keeps its port, models and folders.
    command: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: Path) -> Server:
        path = Path(run_dir) / SERVER_FILE
        if not path.is_file():
            raise ServeError(
                f"No server is running from {run_dir} ({path} is missing). Start one with `pipeline serve`."
            )
        data = json.loads(path.read_text())
        # A record written before the runtime-neutral one: its runtime's fields are extras.
        known = {f.name for f in fields(cls)}
        legacy = {k: data.pop(k) for k in list(data) if k not in known}
        if legacy.get("gateway_pid"):
            data.setdefault("pids", {})["gateway"] = legacy["gateway_pid"]
        data.setdefault("extras", {}).update(
            {k: v for k, v in legacy.items() if k.endswith("_url") and v}
        )
        data.setdefault("runtime", BUILTIN[0])  # records without one predate the second runtime
        if "served" not in data:  # written before the runtime-neutral name ("archives")
            data["served"] = legacy.get("archives", {})
        data["served"] = {name: ServedInfo.from_json(info) for name, info in data["served"].items()}
        return cls(**data)

    def record(self) -> None:
        """Write server.json into the run folder."""
        (Path(self.run_dir) / SERVER_FILE).write_text(json.dumps(asdict(self), indent=2))

    def keys(self) -> Mapping[str, str]:
        """The tokens by API: 'inference' from inference_key.json, the others from
        `key_files`.

        Each file is read only when its key is asked for, so an inference
        client that cannot read a private key file still gets its key.
        """
        return _Keys(Path(self.run_dir), {"inference": INFERENCE_KEY_FILE, **self.key_files})

    def served_of(self, model: str) -> dict[str, ServedInfo]:
        """What is served of `model` (as the export names it), by served name, in
        registry order (TorchScript, the reference serialisation, first)."""
        order = registry.keys()
        mine = [
            (name, info)
            for name, info in self.served.items()
            if info.model == model and name in self.models and name not in self.failed
        ]
        mine.sort(
            key=lambda item: order.index(item[1].format) if item[1].format in order else len(order)
        )
        return dict(mine)

    def alive(self) -> bool:
        """True only if the recorded pid is still *our* launcher (pids are reused)."""
        return _ours(self.pid, Path(self.run_dir), self.markers)

    def alive_pids(self) -> list[int]:
        """The recorded processes besides the main one that are still ours."""
        return [p for p in self.pids.values() if _ours(p, Path(self.run_dir), self.markers)]


class NoSuchKeyError(ServeError, KeyError):
    """A key the server has no file for: a ServeError that is also the KeyError a
    Mapping raises, so `in` and `.get` on `Server.keys()` work."""

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


class _Keys(Mapping[str, str]):
    def __init__(self, run_dir: Path, files: dict[str, str]) -> None:
        self._run_dir = run_dir
        self._files = files

    def __getitem__(self, api: str) -> str:
        if api not in self._files:
            raise NoSuchKeyError(
                f"This server has no {api} key (its keys: {', '.join(self._files)})."
            )
        path = self._run_dir / self._files[api]
        try:
            return str(json.loads(path.read_text())[api]["key"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            hint = (
                ""
                if api == "inference"
                else f" (the {api} key is readable by the user who ran `pipeline serve` only)"
            )
            raise ServeError(f"Cannot read the {api} token from {path}: {err}{hint}") from None

    def __contains__(self, api: object) -> bool:  # which keys it has, without reading them
        return api in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def is_process(pid: int, marker: Path) -> bool:
    """Is `pid` a live process started with `marker` (its config file) on its command line?

    The command line, not the start time, identifies our processes: a reused
    pid runs something else, and start times read back from /proc can drift
    by more than a second under load.
    """
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and str(marker) in proc.cmdline()
    except psutil.Error:
        return False


def _ours(pid: int, run_dir: Path, markers: list[str] | tuple[str, ...]) -> bool:
    return any(is_process(pid, run_dir / marker) for marker in markers)
