"""`pipeline bench`'s driver for the Ray runtime: every format of the model from one private
server (one cluster start, not one per format), each under a name of its own, measured
at every concurrency level by the shared load loops (pipeline.bench.load)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.core import paths as core_paths
from pipeline.runtimes.ray.constants import NAME
from pipeline.runtimes.ray.launch import private
from pipeline.serving.openinference import OpenInference

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel
    from pipeline.serving.runtime import BenchSettings


def bench_ray(
    model: str, exported: ExportedModel, settings: BenchSettings
) -> tuple[list[Any], list[dict[str, Any]]]:
    from pipeline.bench.load import every_level, first_answers, sequential, sequential_point

    protocol = OpenInference(transports=("rest",))
    inputs = exported.sample(1, seed=0)
    body, expected = protocol.encode(inputs), exported.eager(inputs)
    skipped: list[dict[str, Any]] = []
    formats = settings.served_formats(exported)
    if not formats:
        return [], skipped

    def backend(fmt: str) -> str:
        return f"{NAME}/{fmt}"

    slug = core_paths.model_slug(model)
    names = {fmt: f"{slug}_{fmt}" for fmt in formats}
    exports = [(exported.dir, f) for f in formats]
    with private(exports, list(names.values()), exported.manifest) as server:
        first = first_answers(server, names, body, expected, skipped, model=model, backend=backend)

        def at_one(order: list[str]) -> list[Any]:
            paths = {f: (server, names[f]) for f in order}
            got = sequential(paths, body, settings.requests_per_level, settings.level_budget_s)
            return [
                sequential_point(
                    lat,
                    failed,
                    backend=backend(f),
                    model=model,
                    batching="on",
                    first_request_ms=first[f],
                )
                for f, (lat, failed) in got.items()
            ]

        points = every_level(
            server,
            names,
            [f for f in names if f in first],
            body,
            settings,
            at_one=at_one,
            backend=backend,
            model=model,
            batching="on",
        )
    return points, skipped
