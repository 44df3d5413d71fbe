"""Served throughput and latency: TorchServe (behind the gateway) per format,
concurrency and dynamic batching setting.

Batching settings (`BATCHING`): "off" (batch size 1), "on" (the archive
defaults, as `pipeline archive` writes them) and "old" (batch 8 with a 10 ms
delay, the defaults before they were chosen by measurement; kept so the
throughput target compares against them in the same run). At concurrency 1
each format is also measured on TorchServe's own port (backend
`torchserve-direct/<format>`, same server, same key), interleaved with the
gateway, so the gateway's cost is a difference of two figures from one run.

One private server per batching setting serves every format of a model that
its export holds (TorchScript, ONNX, and the .pt2 when exported); the formats
are measured in turn within each concurrency level (interleaved, so a noisy
neighbour slows them alike). Each request carries the same one-sample
body, and a sample of answers is checked against the first so a broken
server cannot look fast. A format whose first answer fails or is wrong is
left out of that server's measurements and reported as skipped, with why.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

import psutil

from pipeline.bench.load import ServedPoint, check_answer, measure, sequential, sequential_point
from pipeline.bench.targets import DIRECT
from pipeline.core.errors import PipelineError
from pipeline.export.opened import open_export
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.runtimes.torchserve.launch import Server, private_config, start, stop
from pipeline.serving import wire

log = logging.getLogger(__name__)

# Batching setting → (batch size, max batch delay in ms) of the archives measured.
BATCHING: dict[str, tuple[int, int]] = {
    "off": (1, 0),
    "on": (ArchiveConfig.batch_size, ArchiveConfig.max_batch_delay_ms),
    "old": (8, 10),
}


def _direct(server: Server) -> Server:
    """The same server seen without the gateway: TorchServe's own inference port.

    TorchServe checks the same inference key the gateway does, so the client
    needs nothing else.
    """
    return dataclasses.replace(server, inference_url=server.backend_url, ca_file=None)


def _sequential_pair(
    server: Server, name: str, body: wire.Body, requests: int, budget_s: float, **point: Any
) -> list[ServedPoint]:
    """Concurrency 1 through the gateway and on TorchServe's own port, alternately, so the
    difference of the two is the gateway's cost."""
    first_ms, fmt = point.pop("first_ms"), point.pop("fmt")
    got = sequential(
        {"torchserve": (server, name), DIRECT: (_direct(server), name)}, body, requests, budget_s
    )
    return [
        sequential_point(
            lat,
            failed,
            backend=f"{key}/{fmt}",
            first_request_ms=first_ms if key != DIRECT else None,
            **point,
        )
        for key, (lat, failed) in got.items()
    ]


def bench_served(
    model: str,
    export_dir: Path,
    *,
    concurrencies: tuple[int, ...] = (1, 8, 32),
    requests_per_level: int = 200,
    batching: tuple[str, ...] = ("off", "on"),
    timeout: float = 120.0,
    level_budget_s: float = 20.0,
) -> tuple[list[ServedPoint], list[dict[str, Any]]]:
    """Serve `model` (every format it has) once per batching setting and measure each level.

    Returns the points and the formats skipped (model, batch, backend, why).
    """
    exported = open_export(export_dir, model=model)
    formats = tuple(f.key for f in exported.formats())  # every format it holds is measured
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    # binary: JSON text would measure number parsing, not serving
    body = wire.encode(wire.TORCHSERVE, inputs, binary=True)
    points: list[ServedPoint] = []
    skipped: list[dict[str, Any]] = []
    for mode in batching:
        batch_size, delay_ms = BATCHING[mode]
        with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
            store, run_dir = Path(tmp) / "store", Path(tmp) / "run"
            mars = archive(
                ArchiveConfig(
                    model=model,
                    export_dir=export_dir,
                    store=store,
                    formats=formats,
                    batch_size=batch_size,
                    max_batch_delay_ms=delay_ms,
                    response_timeout_s=int(timeout),
                )
            )
            server = start(
                private_config(
                    store,
                    run_dir,
                    # Each format as `pipeline serve` runs a model served alone (one
                    # single-threaded worker per core); the idle formats cost nothing.
                    workers_per_model=psutil.cpu_count(logical=False) or 1,
                    threads_per_worker=1,
                )
            )
            try:
                names = {fmt: mar.stem for fmt, mar in zip(formats, mars, strict=True)}
                first: dict[str, float] = {}
                for fmt, name in names.items():
                    try:
                        first[fmt] = check_answer(server, name, body, expected)
                    except (PipelineError, KeyError, ValueError) as err:
                        why = " ".join(str(err).split())[:200]
                        log.warning("%s (batching %s) is left out: %s", name, mode, why)
                        backend = f"torchserve/{fmt} (batching {mode})"
                        skipped.append({"model": model, "batch": 1, "backend": backend, "why": why})
                live = [f for f in formats if f in first]
                for k, level in enumerate(concurrencies):
                    order = live[k % len(live) :] + live[: k % len(live)] if live else []  # rotated
                    for fmt in order:
                        common = dict(model=model, batching=mode)
                        if level == 1:  # the gateway and TorchServe's own port, alternately
                            points += _sequential_pair(
                                server,
                                names[fmt],
                                body,
                                requests_per_level,
                                level_budget_s,
                                fmt=fmt,
                                first_ms=first[fmt],
                                **common,
                            )
                            continue
                        points.append(
                            measure(
                                server,
                                names[fmt],
                                body,
                                level,
                                requests_per_level,
                                timeout,
                                level_budget_s,
                                backend=f"torchserve/{fmt}",
                                **common,
                            )
                        )
            finally:
                stop(run_dir)
    return points, skipped
