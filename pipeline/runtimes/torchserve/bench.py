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

from pipeline.bench.inprocess import ONE_THREAD
from pipeline.bench.load import ServedPoint, check_answer, measure, sequential, sequential_point
from pipeline.bench.targets import RESNET, cell, served_at, target
from pipeline.core.errors import PipelineError
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.runtimes.torchserve import NAME, codec
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.runtimes.torchserve.launch import Server, private_config, start, stop
from pipeline.serving import wire

log = logging.getLogger(__name__)

DIRECT = f"{NAME}-direct"  # backend prefix of served points on TorchServe's own port

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
    return dataclasses.replace(server, inference_url=server.extras["backend_url"], ca_file=None)


def _sequential_pair(
    server: Server, name: str, body: wire.Body, requests: int, budget_s: float, **point: Any
) -> list[ServedPoint]:
    """Concurrency 1 through the gateway and on TorchServe's own port, alternately, so the
    difference of the two is the gateway's cost."""
    first_ms, fmt = point.pop("first_ms"), point.pop("fmt")
    got = sequential(
        {NAME: (server, name), DIRECT: (_direct(server), name)}, body, requests, budget_s
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
    exported: ExportedModel,
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
    formats = tuple(f.key for f in exported.formats())  # every format it holds is measured
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    # binary: JSON text would measure number parsing, not serving
    body = codec.encode(inputs, binary=True)
    points: list[ServedPoint] = []
    skipped: list[dict[str, Any]] = []
    for mode in batching:
        batch_size, delay_ms = BATCHING[mode]
        with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
            store, run_dir = Path(tmp) / "store", Path(tmp) / "run"
            mars = archive(
                ArchiveConfig(
                    model=model,
                    export_dir=exported.dir,
                    store=store,
                    formats=formats,
                    batch_size=batch_size,
                    max_batch_delay_ms=delay_ms,
                    response_timeout_s=int(timeout),
                ),
                exported.manifest,
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
                        backend = f"{NAME}/{fmt} (batching {mode})"
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
                                backend=f"{NAME}/{fmt}",
                                **common,
                            )
                        )
            finally:
                stop(run_dir)
    return points, skipped


def targets(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """TorchServe's targets: the cost of serving against in-process, batching, the gateway."""
    return [*_serving_cost(cells, served), *_edges(served)]


def _serving_cost(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """Each served format against its own backend in-process: throughput, added latency."""
    out = []
    formats = registry.all_formats()
    for fmt in formats:
        inproc = cell(cells, RESNET, fmt.backend, 1)
        at8 = served_at(served, RESNET, fmt.key, 8, "on", NAME)
        if inproc and at8:
            ratio = at8["throughput"] / inproc["throughput"]
            out.append(
                target(
                    f"TorchServe/{fmt.key} at concurrency 8, resnet18: ≥ 85% of in-process {fmt.backend} throughput (batch 1)",
                    ratio,
                    f"{at8['throughput']:.1f} vs {inproc['throughput']:.1f} samples/s",
                    ratio >= 0.85,
                )
            )
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in formats:
            # The single-threaded twin where there is one: the workers run one thread.
            inproc = cell(cells, model, f"{fmt.backend}{ONE_THREAD}", 1) or cell(
                cells, model, fmt.backend, 1
            )
            at1 = served_at(served, model, fmt.key, 1, "off", NAME)
            if inproc and at1:
                added = at1["median_ms"] - inproc["median_ms"]
                out.append(
                    target(
                        f"{model} TorchServe/{fmt.key} added p50 latency at concurrency 1 ≤ 5 ms (vs in-process, {inproc['threads']} thread(s) like the worker)",
                        added,
                        f"{at1['median_ms']:.2f} vs {inproc['median_ms']:.2f} ms in-process",
                        added <= 5.0,
                    )
                )
    return out


def _edges(served: list[dict]) -> list[dict[str, Any]]:
    """Batching without waiting and a cheap gateway (all figures from one server run each).

    "on" is the archive defaults, "off" batch size 1, "old" the defaults before
    they were measured (batch 8, 10 ms); direct is TorchServe's own port.
    """
    out = []
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in registry.all_formats():
            on1 = served_at(served, model, fmt.key, 1, "on", NAME)
            off1 = served_at(served, model, fmt.key, 1, "off", NAME)
            direct_off = served_at(served, model, fmt.key, 1, "off", DIRECT)
            if on1 and direct_off:
                ratio = on1["median_ms"] / direct_off["median_ms"]
                out.append(
                    target(
                        f"{model} {fmt.key}: served p50 at concurrency 1 (archive defaults, through the gateway) ≤ 1.1× TorchServe's own port with batching off",
                        ratio,
                        f"{on1['median_ms']:.2f} vs {direct_off['median_ms']:.2f} ms",
                        ratio <= 1.1,
                    )
                )
            if on1 and off1:
                wait = on1["median_ms"] - off1["median_ms"]
                out.append(
                    target(
                        f"{model} {fmt.key}: a lone request waits ≤ 1 ms for a batch (p50 at concurrency 1, archive defaults − batching off, both through the gateway)",
                        wait,
                        f"{on1['median_ms']:.2f} vs {off1['median_ms']:.2f} ms",
                        wait <= 1.0,
                    )
                )
            if off1 and direct_off:
                cost = off1["median_ms"] - direct_off["median_ms"]
                out.append(
                    target(
                        f"{model} {fmt.key}: gateway cost ≤ 0.5 ms (p50 at concurrency 1, gateway − TorchServe's own port, batching off)",
                        cost,
                        f"{off1['median_ms']:.2f} vs {direct_off['median_ms']:.2f} ms",
                        cost <= 0.5,
                    )
                )
            on8 = served_at(served, model, fmt.key, 8, "on", NAME)
            old8 = served_at(served, model, fmt.key, 8, "old", NAME)
            if on8 and old8:
                ratio = on8["throughput"] / old8["throughput"]
                out.append(
                    target(
                        f"{model} {fmt.key}: throughput at concurrency 8 with the archive defaults ≥ the old defaults (batch 8, 10 ms)",
                        ratio,
                        f"{on8['throughput']:.0f} vs {old8['throughput']:.0f} requests/s",
                        ratio >= 1.0,
                    )
                )
    return out
