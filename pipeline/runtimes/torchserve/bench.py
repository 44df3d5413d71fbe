"""Served throughput and latency: TorchServe (behind the gateway) per format,
concurrency and dynamic batching setting.

Batching settings (`BATCHING`): "off" (batch size 1), "on" (the archive
defaults, as `pipeline archive` writes them) and "old" (batch 8 with a 10 ms
delay, the defaults before they were chosen by measurement; kept so the
throughput target compares against them in the same run). At concurrency 1
each format is also measured on TorchServe's own port (backend
`torchserve/<format>/direct`, same server, same key), interleaved with the
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
from prometheus_client.parser import text_string_to_metric_families

from pipeline.bench import split
from pipeline.bench.inprocess import ONE_THREAD
from pipeline.bench.load import (
    ServedPoint,
    every_level,
    first_answers,
    sequential,
    sequential_point,
)
from pipeline.bench.targets import RESNET, cell, served_at, versus
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.runtimes.torchserve import codec
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.runtimes.torchserve.constants import NAME
from pipeline.runtimes.torchserve.launch import Server, private_config, start, stop
from pipeline.serving import wire
from pipeline.serving.runtime import BenchSettings

log = logging.getLogger(__name__)

# The route of served points on TorchServe's own port: backend `torchserve/<format>/direct`
# (the prefix stays the runtime's name; the gateway's points are `torchserve/<format>`).
DIRECT = "direct"

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
    gateway, direct = f"{NAME}/{fmt}", f"{NAME}/{fmt}/{DIRECT}"
    got = sequential(
        {gateway: (server, name), direct: (_direct(server), name)}, body, requests, budget_s
    )
    return [
        sequential_point(
            lat,
            failed,
            backend=key,
            first_request_ms=first_ms if key == gateway else None,
            **point,
        )
        for key, (lat, failed) in got.items()
    ]


def bench_served(
    model: str, exported: ExportedModel, settings: BenchSettings, timeout: float = 120.0
) -> tuple[list[ServedPoint], list[dict[str, Any]]]:
    """Serve `model` (the formats `settings` asks for that it has) once per batching setting of `settings` and
    measure each level. Returns the points and the formats skipped (model, batch, backend,
    why)."""
    formats = tuple(settings.served_formats(exported))  # those bench asks for, if held
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    # binary: JSON text would measure number parsing, not serving
    body = codec.encode(inputs, binary=True)
    points: list[ServedPoint] = []
    skipped: list[dict[str, Any]] = []
    for mode in settings.batching:
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
                points += _measure_server(
                    server, names, body, expected, skipped, settings, model, mode, timeout
                )
            finally:
                stop(run_dir)
    return points, skipped


def _measure_server(
    server: Server,
    names: dict[str, str],
    body: wire.Body,
    expected: dict[str, Any],
    skipped: list[dict[str, Any]],
    settings: BenchSettings,
    model: str,
    mode: str,
    timeout: float,
) -> list[ServedPoint]:
    """One private server's formats (format → archive name in `names`): first answers
    checked, then every level."""
    first = first_answers(
        server,
        names,
        body,
        expected,
        skipped,
        model=model,
        backend=lambda fmt: f"{NAME}/{fmt} (batching {mode})",
    )

    def at_one(order: list[str]) -> list[ServedPoint]:
        # the gateway and TorchServe's own port, alternately, format by format
        return [
            point
            for fmt in order
            for point in _sequential_pair(
                server,
                names[fmt],
                body,
                settings.requests_per_level,
                settings.level_budget_s,
                fmt=fmt,
                first_ms=first[fmt],
                model=model,
                batching=mode,
            )
        ]

    live = [f for f in names if f in first]
    return every_level(
        server,
        names,
        live,
        body,
        settings,
        at_one=at_one,
        backend=lambda fmt: f"{NAME}/{fmt}",
        timeout=timeout,
        model=model,
        batching=mode,
        probe=split.scraper(server, read_split),
    )


def targets(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """TorchServe's targets: the cost of serving against in-process, batching, the gateway."""
    return [*_serving_cost(cells, served), *_edges(served)]


def _serving_cost(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """Each served format against its own backend in-process: throughput, added latency."""
    out = []
    formats = registry.all_formats()
    for fmt in formats:
        out += versus(
            f"TorchServe/{fmt.key} at concurrency 8, resnet18: ≥ 85% of in-process {fmt.backend} throughput (batch 1)",
            served_at(served, RESNET, fmt.key, 8, "on", NAME),
            cell(cells, RESNET, fmt.backend, 1),
            "throughput",
            0.85,
            at_least=True,
            shown="{a:.1f} vs {b:.1f} samples/s",
        )
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in formats:
            # The single-threaded twin where there is one: the workers run one thread.
            inproc = cell(cells, model, f"{fmt.backend}{ONE_THREAD}", 1) or cell(
                cells, model, fmt.backend, 1
            )
            threads = inproc["threads"] if inproc else 0
            out += versus(
                f"{model} TorchServe/{fmt.key} added p50 latency at concurrency 1 ≤ 5 ms (vs in-process, {threads} thread(s) like the worker)",
                served_at(served, model, fmt.key, 1, "off", NAME),
                inproc,
                "median_ms",
                5.0,
                difference=True,
                shown="{a:.2f} vs {b:.2f} ms in-process",
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
            direct_off = served_at(served, model, fmt.key, 1, "off", NAME, route=DIRECT)
            p50 = "p50 at concurrency 1"
            out += versus(
                f"{model} {fmt.key}: served {p50} (archive defaults, through the gateway) ≤ 1.1× TorchServe's own port with batching off",
                on1,
                direct_off,
                "median_ms",
                1.1,
            )
            out += versus(
                f"{model} {fmt.key}: a lone request waits ≤ 1 ms for a batch ({p50}, archive defaults − batching off, both through the gateway)",
                on1,
                off1,
                "median_ms",
                1.0,
                difference=True,
            )
            out += versus(
                f"{model} {fmt.key}: gateway cost ≤ 0.5 ms ({p50}, gateway − TorchServe's own port, batching off)",
                off1,
                direct_off,
                "median_ms",
                0.5,
                difference=True,
            )
            out += versus(
                f"{model} {fmt.key}: throughput at concurrency 8 with the archive defaults ≥ the old defaults (batch 8, 10 ms)",
                served_at(served, model, fmt.key, 8, "on", NAME),
                served_at(served, model, fmt.key, 8, "old", NAME),
                "throughput",
                1.0,
                at_least=True,
                shown="{a:.0f} vs {b:.0f} requests/s",
            )
    return out


# TorchServe's frontend counters (RestJob): both start when the frontend takes the
# request, so "backend" is inference less queue: the worker's round trip, handler included.
TS_QUEUE, TS_INFERENCE = "ts_queue_latency_microseconds", "ts_inference_latency_microseconds"
TS_REQUESTS = "ts_inference_requests"  # its samples: ..._total


def read_split(text: str) -> split.Totals:
    """TorchServe's per-model queue and backend time, from its frontend counters (µs)."""
    by: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):  # counters: by family name
        if family.name not in (TS_QUEUE, TS_INFERENCE, TS_REQUESTS):
            continue
        for sample in family.samples:
            model = by.setdefault(sample.labels.get("model_name", ""), {})
            model[family.name] = model.get(family.name, 0.0) + sample.value
    out: split.Totals = {}
    for name, got in by.items():
        n, queue = got.get(TS_REQUESTS, 0.0), got.get(TS_QUEUE, 0.0) / 1e6
        out[(name, "queue")] = (queue, n)
        out[(name, "backend")] = (got.get(TS_INFERENCE, 0.0) / 1e6 - queue, n)
    return out
