"""The KServe runtime beside TorchServe: the same exports, clients and levels.

One private runtime (`pipeline.runtimes.kserve.launch.private`, free loopback ports)
serves every format a model's export holds, each under its own name, with
the runtime's defaults as `pipeline serve --runtime kserve` starts it: batch
up to 8 requests already queued (no waiting), one forward pass at a time
per model with one intra-op thread per physical core. Bodies are the Open
Inference Protocol's binary extension (TorchServe gets `.npy`: neither
parses numbers). Concurrency 1 alternates the formats request by request
over one kept-alive connection each, as TorchServe's gateway and own port
are; higher levels use the same async client as TorchServe's. Points are
`kserve/<format>` with batching "on".
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any

from pipeline.bench.load import ServedPoint, check_answer, measure, sequential, sequential_point
from pipeline.bench.targets import DIGITS, RESNET, cell, served_at, target
from pipeline.core.errors import PipelineError
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.runtimes.kserve import NAME
from pipeline.runtimes.kserve.config import ServedExport, default_threads
from pipeline.runtimes.kserve.launch import private, served_export

# The KServe runtime's targets measure it against TorchServe's points in the same run.
from pipeline.runtimes.torchserve import NAME as TORCHSERVE
from pipeline.serving import wire
from pipeline.serving.server import ServeError, Server

log = logging.getLogger(__name__)

BATCHING = "on"  # the runtime's defaults: up to 8 queued requests, no waiting


def bench_kserve(
    model: str,
    exported: ExportedModel,
    *,
    concurrencies: tuple[int, ...] = (1, 8, 32),
    requests_per_level: int = 200,
    timeout: float = 120.0,
    level_budget_s: float = 20.0,
    threads: int | None = None,
) -> tuple[list[ServedPoint], list[dict[str, Any]]]:
    """Serve every format of `model` from one KServe runtime and measure each level.

    Returns the points and the formats skipped (model, batch, backend, why).
    """
    formats = [f.key for f in exported.formats()]
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    body = wire.oip_binary(inputs)
    slug = re.sub(r"[^A-Za-z0-9_.\-]", "_", model)
    exports = [
        served_export(exported.dir, fmt, name=f"{slug}_{fmt}", manifest=exported.manifest)
        for fmt in formats
    ]
    skipped: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        server, exports = _start(stack, model, exports, threads or default_threads(), skipped)
        if server is None:
            return [], skipped
        return _measure_all(
            server,
            model,
            {m.format: m.name for m in exports},
            body,
            expected,
            skipped,
            concurrencies=concurrencies,
            requests_per_level=requests_per_level,
            timeout=timeout,
            level_budget_s=level_budget_s,
        ), skipped


def _start(
    stack: contextlib.ExitStack,
    model: str,
    exports: list[ServedExport],
    threads: int,
    skipped: list[dict[str, Any]],
) -> tuple[Server | None, list[ServedExport]]:
    """The runtime serving every export that loads. One that does not stops the runtime
    from starting at all, so then each is tried alone and the ones that fail are skipped."""
    loads = exports
    for attempt in range(2):
        try:
            return stack.enter_context(private(loads, threads=threads)), loads
        except ServeError as err:
            if len(loads) == 1 or attempt:
                _skip(skipped, model, loads, err)
                return None, []
        loads = []
        for one in exports:
            try:
                with private([one], threads=threads):
                    loads.append(one)
            except ServeError as err:
                _skip(skipped, model, [one], err)
        if not loads:
            return None, []
    raise AssertionError("unreachable")  # pragma: no cover


def _skip(
    skipped: list[dict[str, Any]], model: str, exports: list[ServedExport], err: Exception
) -> None:
    why = " ".join(str(err).split())[-300:]
    for one in exports:
        log.warning("the KServe runtime did not start for %s: %s", one.name, why)
        skipped.append({"model": model, "batch": 1, "backend": f"{NAME}/{one.format}", "why": why})


def _measure_all(
    server: Server,
    model: str,
    names: dict[str, str],
    body: wire.Body,
    expected: dict[str, Any],
    skipped: list[dict[str, Any]],
    *,
    concurrencies: tuple[int, ...],
    requests_per_level: int,
    timeout: float,
    level_budget_s: float,
) -> list[ServedPoint]:
    """Check each format's first answer, then measure every level."""
    points: list[ServedPoint] = []
    first: dict[str, float] = {}
    for fmt, name in names.items():
        try:
            first[fmt] = check_answer(server, name, body, expected)
        except (PipelineError, KeyError, ValueError) as err:
            why = " ".join(str(err).split())[:200]
            log.warning("%s on the KServe runtime is left out: %s", name, why)
            skipped.append({"model": model, "batch": 1, "backend": f"{NAME}/{fmt}", "why": why})
    live = [f for f in names if f in first]
    common = dict(model=model, batching=BATCHING)
    for k, level in enumerate(concurrencies):
        if not live:
            break
        if level == 1:  # every format alternately, over one connection each
            got = sequential(
                {fmt: (server, names[fmt]) for fmt in live},
                body,
                requests_per_level,
                level_budget_s,
            )
            points += [
                sequential_point(
                    lat, failed, backend=f"{NAME}/{fmt}", first_request_ms=first[fmt], **common
                )
                for fmt, (lat, failed) in got.items()
            ]
            continue
        for fmt in live[k % len(live) :] + live[: k % len(live)]:  # rotated per level
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
    return points


def targets(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """The KServe runtime against TorchServe (same run, same exports, same clients) and,
    for resnet18, against its own format in-process."""
    out = []
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in registry.all_formats():
            k1 = served_at(served, model, fmt.key, 1, "on", NAME)
            ts1 = served_at(served, model, fmt.key, 1, "on", TORCHSERVE)
            if k1 and model == DIGITS:
                versus = f"; TorchServe {ts1['median_ms']:.2f} ms" if ts1 else ""
                out.append(
                    target(
                        f"{model} kserve/{fmt.key}: p50 at concurrency 1 ≤ 2 ms",
                        k1["median_ms"],
                        f"{k1['median_ms']:.2f} ms{versus}",
                        k1["median_ms"] <= 2.0,
                    )
                )
            k8 = served_at(served, model, fmt.key, 8, "on", NAME)
            ts8 = served_at(served, model, fmt.key, 8, "on", TORCHSERVE)
            if k8 and ts8:
                ratio = k8["throughput"] / ts8["throughput"]
                out.append(
                    target(
                        f"{model} kserve/{fmt.key}: throughput at concurrency 8 ≥ 3× TorchServe's (archive defaults)",
                        ratio,
                        f"{k8['throughput']:.0f} vs {ts8['throughput']:.0f} requests/s",
                        ratio >= 3.0,
                    )
                )
            inproc = cell(cells, model, fmt.backend, 1)
            if k8 and inproc and model == RESNET:
                ratio = k8["throughput"] / inproc["throughput"]
                out.append(
                    target(
                        f"{model} kserve/{fmt.key}: throughput at concurrency 8 ≥ 0.9× in-process {fmt.backend} (batch 1)",
                        ratio,
                        f"{k8['throughput']:.1f} vs {inproc['throughput']:.1f} samples/s",
                        ratio >= 0.9,
                    )
                )
    return out
