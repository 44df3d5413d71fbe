"""The KServe runtime beside TorchServe: the same exports, clients and levels.

One private runtime (`pipeline.runtimes.kserve.launch.private`, free loopback ports)
serves every format a model's export holds, each under its own name, with
the runtime's defaults as `pipeline serve --runtime kserve` starts it: batch
up to 8 requests already queued (no waiting), one forward pass at a time
per model and worker, the physical cores' intra-op threads shared out among the
workers. With `settings.tune` (`pipeline bench`) the worker count is first swept
(`sweep.py`) and the rows are measured with the best; otherwise one worker. Bodies are the Open
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

from prometheus_client.parser import text_string_to_metric_families

from pipeline.bench import load, split
from pipeline.bench.targets import DIGITS, RESNET, cell, served_at, target, versus
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.runtimes.kserve import sweep
from pipeline.runtimes.kserve.config import ServedExport, default_threads
from pipeline.runtimes.kserve.constants import NAME
from pipeline.runtimes.kserve.launch import private, served_export

# The KServe runtime's targets measure it against TorchServe's points in the same run.
from pipeline.serving import runtime, wire
from pipeline.serving.runtime import BenchSettings
from pipeline.serving.server import ServeError, Server

log = logging.getLogger(__name__)

BATCHING = "on"  # the runtime's defaults: up to 8 queued requests, no waiting


def bench_kserve(
    model: str,
    exported: ExportedModel,
    settings: BenchSettings,
    *,
    timeout: float = 120.0,
    threads: int | None = None,
) -> tuple[list[load.ServedPoint], list[dict[str, Any]]]:
    """Serve every format of `model` from one KServe runtime and measure each level of
    `settings` (its batching: the runtime's own, `BATCHING`).

    Returns the points and the formats skipped (model, batch, backend, why).
    """
    formats = settings.served_formats(exported)
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    body = wire.oip_binary(inputs)
    slug = re.sub(r"[^A-Za-z0-9_.\-]", "_", model)
    exports = [
        served_export(exported.dir, fmt, name=f"{slug}_{fmt}", manifest=exported.manifest)
        for fmt in formats
    ]
    skipped: list[dict[str, Any]] = []
    workers = 1
    if settings.tune:  # how many processes serve this model best here, then serve with that
        found = sweep.sweep(
            model,
            exported,
            requests=settings.requests_per_level,
            budget_s=settings.level_budget_s,
            timeout=timeout,
        )
        if found is not None:
            workers = found["best"]
            if settings.out_dir is not None:
                sweep.write(settings.out_dir, {exported.name: found})
    with contextlib.ExitStack() as stack:
        server, exports = _start(
            stack, model, exports, workers, threads or default_threads(workers), skipped
        )
        if server is None:
            return [], skipped
        names = {m.format: m.name for m in exports}
        first = load.first_answers(
            server, names, body, expected, skipped, model=model, backend=_backend
        )

        def at_one(order: list[str]) -> list[load.ServedPoint]:
            # every format alternately, over one connection each
            got = load.sequential(
                {fmt: (server, names[fmt]) for fmt in order},
                body,
                settings.requests_per_level,
                settings.level_budget_s,
            )
            return [
                load.sequential_point(
                    lat,
                    failed,
                    backend=_backend(fmt),
                    first_request_ms=first[fmt],
                    model=model,
                    batching=BATCHING,
                )
                for fmt, (lat, failed) in got.items()
            ]

        live = [f for f in names if f in first]
        points = load.every_level(
            server,
            names,
            live,
            body,
            settings,
            at_one=at_one,
            backend=_backend,
            timeout=timeout,
            model=model,
            batching=BATCHING,
            probe=split.scraper(server, read_split),
        )
        return points, skipped


def _backend(fmt: str) -> str:
    return f"{NAME}/{fmt}"


def _start(
    stack: contextlib.ExitStack,
    model: str,
    exports: list[ServedExport],
    workers: int,
    threads: int,
    skipped: list[dict[str, Any]],
) -> tuple[Server | None, list[ServedExport]]:
    """The runtime serving every export that loads. One that does not stops the runtime
    from starting at all, so then each is tried alone and the ones that fail are skipped."""
    loads = exports
    for attempt in range(2):
        try:
            return stack.enter_context(private(loads, workers=workers, threads=threads)), loads
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


def _others(served: list[dict]) -> list[str]:
    """The other runtimes measured in the same run: their backends' prefixes that name a
    registered runtime (asked of the registry, so this package imports no other runtime)."""
    names = set(runtime.names()) - {NAME}
    return sorted({str(s["backend"]).split("/")[0] for s in served} & names)


def targets(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """The KServe runtime against every other runtime of the same run (same exports, same
    clients) and, for resnet18, against its own format in-process."""
    out = []
    others = {o: runtime.get(o).title for o in _others(served)}
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in registry.all_formats():
            k1 = served_at(served, model, fmt.key, 1, "on", NAME)
            if k1 and model == DIGITS:
                peers = "".join(
                    f"; {title} {p['median_ms']:.2f} ms"
                    for o, title in others.items()
                    if (p := served_at(served, model, fmt.key, 1, "on", o))
                )
                out.append(
                    target(
                        f"{model} kserve/{fmt.key}: p50 at concurrency 1 ≤ 2 ms",
                        k1["median_ms"],
                        f"{k1['median_ms']:.2f} ms{peers}",
                        k1["median_ms"] <= 2.0,
                    )
                )
            k8 = served_at(served, model, fmt.key, 8, "on", NAME)
            for other, title in others.items():
                out += versus(
                    f"{model} kserve/{fmt.key}: throughput at concurrency 8 ≥ 3× {title}'s (each with its defaults)",
                    k8,
                    served_at(served, model, fmt.key, 8, "on", other),
                    "throughput",
                    3.0,
                    at_least=True,
                    shown="{a:.0f} vs {b:.0f} requests/s",
                )
            if model == RESNET:
                out += versus(
                    f"{model} kserve/{fmt.key}: throughput at concurrency 8 ≥ 0.9× in-process {fmt.backend} (batch 1)",
                    k8,
                    cell(cells, model, fmt.backend, 1),
                    "throughput",
                    0.9,
                    at_least=True,
                    shown="{a:.1f} vs {b:.1f} samples/s",
                )
    return out


SPLIT_PREFIX = "pipeline_kserve_"  # the runtime's stage histograms: <prefix><stage>_seconds


def read_split(text: str) -> split.Totals:
    """The stage histograms' sums and counts in a Prometheus text scrape."""
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        stage = family.name.removeprefix(SPLIT_PREFIX).removesuffix("_seconds")
        if not family.name.startswith(SPLIT_PREFIX) or stage not in split.STAGES:
            continue
        for sample in family.samples:
            key = (sample.labels.get("model_name", ""), stage)
            if sample.name.endswith("_sum"):
                sums[key] = sums.get(key, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                counts[key] = counts.get(key, 0.0) + sample.value
    return {k: (sums.get(k, 0.0), counts.get(k, 0.0)) for k in sums.keys() | counts.keys()}
