"""Peers: other servers of the same ONNX file, measured beside ours in the same run.

Issue 28, point 5. For each model in `BenchConfig.peer_models` (the digits CNN
by default) bench serves the export's ONNX file from

* the yardstick (`yardstick_server.py`): aiohttp + ONNX Runtime, one thread,
  about 25 lines: what serving costs with nothing but a parser in the way;
* LitServe (`litserve_server.py`, the `bench` extra), with as many workers as
  our runtime has processes, batching off and on;
* our runtime: each registered runtime that speaks the peers' protocol (the
  Open Inference Protocol's JSON on its route), started as bench starts it.

All get the same body (OIP JSON, one sample), the same headers and the same
clients as the served rows (`pipeline.bench.load`: one kept-alive connection at
concurrency 1, one aiohttp loop at 8), and every first answer is checked against
eager. Each server is measured alone, started and stopped around its own
window: LitServe with batching on polls its queue every millisecond and took 11%
of a core while idle here, which would slow whichever server was measured
beside it. With `peer_rounds` 2 the second round runs the servers in reverse
order and each level keeps its better round (a busy moment only slows a server).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from pipeline.bench import load, split
from pipeline.bench.peers.servers import PeerSpec, litserve_missing, started
from pipeline.core.errors import PipelineError
from pipeline.serving import runtime, wire
from pipeline.serving.capabilities import PrivateSettings
from pipeline.serving.openinference import OpenInference

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel
    from pipeline.serving.server import Server

log = logging.getLogger(__name__)

FORMAT = "onnx"  # the file every peer serves
LEVELS = (1, 8)  # the levels the targets read
YARDSTICK = "yardstick"
LITSERVE = "litserve"
# LitServe's batching "on": the KServe runtime's batch size. Not a 0 s timeout: then
# LitServe's batched loop spins on an empty queue and takes a core; 1 ms is the
# granularity its own collate loop polls at.
LITSERVE_BATCH = ("--max-batch-size", "8", "--batch-timeout", "0.001")


@dataclass
class PeerRun:
    """What the peer phase measured for one model."""

    points: list[load.ServedPoint] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    # backend (label/format, batching) → how it was run: workers, threads, batching
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    ours: list[str] = field(default_factory=list)  # our runtimes' names among the rows


def protocol_runtimes(inputs: dict[str, Any]) -> list[runtime.Runtime]:
    """The registered runtimes that take the peers' exact request (OIP JSON on the OIP
    route): asked of each runtime's protocol, never of its name."""
    body = wire.oip_json(inputs)
    oip = OpenInference()
    return [
        rt
        for rt in runtime.all_runtimes()
        if rt.protocol.infer_path("m") == oip.infer_path("m")
        and rt.protocol.encode(inputs).content == body
    ]


def bench_peers(
    model: str,
    exported: ExportedModel,
    *,
    runtimes: tuple[str, ...] | None,
    requests: int,
    level_budget_s: float,
    rounds: int,
    tuned_in: Path | None = None,
) -> PeerRun:
    """Measure the peers and our runtimes (those in `runtimes`, None: all) serving
    `exported`'s ONNX file; `rounds` passes, alternating the order. `tuned_in`: the bench
    folder whose findings our runtimes start with (their worker count), as serve does."""
    run = PeerRun()
    if FORMAT not in {f.key for f in exported.formats()}:
        why = f"{model}'s export holds no {FORMAT} artifact; re-export with --format all"
        run.skipped.append({"model": model, "batch": 1, "backend": f"peers/{FORMAT}", "why": why})
        return run
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    body = wire.Body(wire.oip_json(inputs), {"Content-Type": "application/json"})
    speakers = protocol_runtimes(inputs)
    if not speakers:
        raise PipelineError("No registered runtime serves the Open Inference Protocol's JSON.")
    ours = [rt for rt in speakers if runtimes is None or rt.name in runtimes]
    run.ours = [rt.name for rt in ours]
    by_name = {rt.name: rt for rt in ours}
    onnx = exported.path(FORMAT)
    workers = [1]  # our runtime's processes, counted once it is up

    def ours_window(rt: runtime.Runtime) -> Any:
        @contextlib.contextmanager
        def window() -> Iterator[tuple[Server, str]]:
            with rt.private(exported, FORMAT, PrivateSettings(tuned_in=tuned_in)) as server:
                name = server.models[0]
                workers[0] = max(1, len(rt.worker_pids(server, name)))
                run.settings[f"{rt.name}/{FORMAT} on"] = {
                    "workers": workers[0],
                    "settings": "the runtime's defaults, as bench's served rows",
                }
                yield server, name

        return rt.name, "on", window

    def peer_window(label: str, batching: str, args: tuple[str, ...], ready: str) -> Any:
        @contextlib.contextmanager
        def window() -> Iterator[tuple[Server, str]]:
            extra = args
            if label == LITSERVE:  # its workers: as many as our runtime has processes
                threads = max(1, (psutil.cpu_count(logical=False) or 1) // workers[0])
                extra = (*args, "--workers", str(workers[0]), "--threads", str(threads))
                run.settings[f"{label}/{FORMAT} {batching}"] = {
                    "workers": workers[0],
                    "intra_op_threads": threads,
                    "args": " ".join(extra),
                }
            else:
                run.settings[f"{label}/{FORMAT} {batching}"] = {"workers": 1, "threads": 1}
            spec = PeerSpec(label, f"{label}_server.py", batching, ready, extra)
            with started(spec, onnx, _slug(model), speakers[0].name) as server:
                yield server, server.models[0]

        return label, batching, window

    windows = [ours_window(rt) for rt in ours]
    windows.append(peer_window(YARDSTICK, "off", (), "/v2/health/ready"))
    missing = litserve_missing()
    if missing:
        log.warning("%s", missing)
        run.skipped.append(
            {"model": model, "batch": 1, "backend": f"{LITSERVE}/{FORMAT}", "why": missing}
        )
    else:
        # ZeroMQ between LitServe's API and worker processes: its advice above 100
        # requests/s, and 3-14% more requests/s at concurrency 8 here (one run each).
        fast = ("--fast-queue",)
        windows.append(peer_window(LITSERVE, "off", fast, "/health"))
        windows.append(peer_window(LITSERVE, "on", (*fast, *LITSERVE_BATCH), "/health"))

    best: dict[tuple[str, str, int], load.ServedPoint] = {}
    for r in range(rounds):
        for label, batching, window in windows if r % 2 == 0 else windows[::-1]:
            backend = f"{label}/{FORMAT}"
            try:
                with window() as (server, name):
                    report = by_name[label].bench_report if label in by_name else None
                    probe = split.scraper(server, report.split) if report else None
                    got = measure_levels(
                        server, name, body, expected, requests, level_budget_s, probe
                    )
            except PipelineError as err:  # a peer that fails is left out, with why
                why = " ".join(str(err).split())[-300:]
                log.warning("%s (batching %s) is left out: %s", backend, batching, why)
                run.skipped.append({"model": model, "batch": 1, "backend": backend, "why": why})
                continue
            for point in got:
                point.model, point.backend, point.batching = model, backend, batching
                key = (backend, batching, point.concurrency)
                if key not in best or _better(point, best[key]):
                    best[key] = point
    run.points = list(best.values())
    return run


def _slug(model: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in model)


def _better(a: load.ServedPoint, b: load.ServedPoint) -> bool:
    """At concurrency 1 the lower p50, above it the higher throughput."""
    return a.median_ms < b.median_ms if a.concurrency == 1 else a.throughput > b.throughput


def measure_levels(
    server: Server,
    name: str,
    body: wire.Body,
    expected: dict[str, Any],
    requests: int,
    budget_s: float,
    probe: split.Probe | None = None,
) -> list[load.ServedPoint]:
    """First answer checked, then concurrency 1 and 8 with the served rows' clients;
    `probe`: our runtime's stage totals, for each row's server split."""
    first = load.check_answer(server, name, body, expected)
    points = []
    for level in LEVELS:
        before = probe() if probe else {}
        with load.windows(probe) as starts:  # each level's window opens after its warm-up
            if level == 1:
                one = load.sequential({"one": (server, name)}, body, requests, budget_s)
                lat, failed = one["one"]
                point = load.sequential_point(
                    lat, failed, first_request_ms=first, model="", backend="", batching=""
                )
            else:
                point = load.measure(
                    server,
                    name,
                    body,
                    level,
                    requests,
                    120.0,
                    budget_s,
                    model="",
                    backend="",
                    batching="",
                )
        if probe:
            start = starts.get(name, before)
            point.server_ms = split.between(start, probe(), name, point.mean_ms)
        points.append(point)
    return points
