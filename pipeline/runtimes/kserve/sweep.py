"""How many runtime processes serve best on this machine: bench measures it, serve reads it.

More workers run more of the Python request path at once, but each takes cores from
the clients on the same machine and holds its own copy of every model; which count
answers most depends on the machine and the model (on the 2-core machine, with the
clients beside the server, one worker out-answered two). So bench serves each model's
ONNX file (else its first format) from a private runtime with each candidate count
(`candidates`: 1, 2, 4, 8 up to the cores, and the cores but one), the threads shared
out as `pipeline serve` shares them, and measures requests per second at concurrency 8
and 32 with the served rows' clients and binary bodies. The best count (`best_of`: the
most req/s over both levels, each relative to its level's best; within TIE of the best,
the fewest, since each worker costs memory) is written with the machine it was measured
on to `<bench dir>/kserve_workers.json`.

`pipeline serve --runtime kserve` without `--workers` reads that file: on the machine it
was measured on (the same CPU model and cores), the served model's best count (or, for a
model not swept, the most common best); elsewhere, or without a bench, the rule in
`config.default_workers`, and serve says which it used.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.fileio import write_json
from pipeline.runtimes.kserve.config import (
    MAX_DEFAULT_WORKERS,
    cores,
    default_threads,
    default_workers,
)

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel

log = logging.getLogger(__name__)

SWEEP_FILE = "kserve_workers.json"
LEVELS = (8, 32)
TIE = 0.03  # counts within 3% of the best req/s are a tie, and the fewest workers win
PREFERRED_FORMAT = "onnx"


def candidates(n_cores: int | None = None) -> list[int]:
    """1, 2, 4, 8 up to the cores (and MAX_DEFAULT_WORKERS), plus the cores but one."""
    n = n_cores or cores()
    top = min(n, MAX_DEFAULT_WORKERS)
    counts = {c for c in (1, 2, 4, 8) if c <= top} | {max(1, min(n - 1, top))}
    return sorted(counts)


def machine() -> dict[str, Any]:
    """What a measurement is only valid on: the CPU model and the cores serve may use."""
    from pipeline.bench.machine import cpu_model

    return {"cpu": cpu_model(), "cores": cores()}


def best_of(points: list[dict[str, Any]]) -> int:
    """The count with the best req/s over the levels, each level's req/s taken relative to
    that level's best (so the highest level's larger figures do not outvote the others);
    within TIE of the best score, the fewest workers."""
    levels = {p["concurrency"] for p in points}
    top = {c: max(p["throughput"] for p in points if p["concurrency"] == c) for c in levels}
    share: dict[int, list[float]] = {}
    for p in points:
        share.setdefault(p["workers"], []).append(p["throughput"] / top[p["concurrency"]])
    score = {w: sum(s) / len(levels) for w, s in share.items()}  # a missing level counts 0
    best = max(score.values())
    return min(w for w, v in score.items() if v >= best * (1 - TIE))


def sweep(
    model: str, exported: ExportedModel, *, requests: int, budget_s: float, timeout: float = 120.0
) -> dict[str, Any] | None:
    """Measure every candidate count serving `model`; None if no runtime started."""
    # Imported here: `pipeline serve` reads the sweep's file (`choose`) without the load client.
    from pipeline.bench import load
    from pipeline.runtimes.kserve.launch import private, served_export
    from pipeline.serving import wire
    from pipeline.serving.server import ServeError

    formats = [f.key for f in exported.formats()]
    fmt = PREFERRED_FORMAT if PREFERRED_FORMAT in formats else formats[0]
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    body = wire.oip_binary(inputs)
    served = served_export(exported.dir, fmt, name="sweep", manifest=exported.manifest)
    points: list[dict[str, Any]] = []
    for workers in candidates():
        threads = default_threads(workers)
        log.info("%s: %d worker(s) × %d thread(s), %s", model, workers, threads, LEVELS)
        try:
            with private([served], workers=workers, threads=threads) as server:
                load.check_answer(server, "sweep", body, expected)
                for level in LEVELS:
                    point = load.measure(
                        server,
                        "sweep",
                        body,
                        level,
                        requests,
                        timeout,
                        budget_s,
                        model=model,
                        backend=f"kserve/{fmt}",
                        batching="on",
                    )
                    points.append({"workers": workers, "threads": threads} | point.to_json())
        except ServeError as err:
            log.warning("%d worker(s) did not start for %s: %s", workers, model, err)
    if not points:
        return None
    return {"format": fmt, "points": points, "best": best_of(points)}


def write(bench_dir: Path, results: dict[str, dict[str, Any]]) -> Path:
    """Merge `results` (model → sweep) into the bench folder's file, for this machine."""
    path = Path(bench_dir) / SWEEP_FILE
    here = machine()
    old = _read(path)
    models = old["models"] if old and old.get("machine") == here else {}
    data = {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": here,
        "models": {**models, **results},
    }
    return write_json(path, data)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("models"), dict) else None


@dataclass(frozen=True)
class WorkerChoice:
    workers: int
    why: str


def choose(bench_dir: Path, models: Iterable[str]) -> WorkerChoice:
    """serve's --workers when not given: bench's best on this machine, else the rule."""
    path = Path(bench_dir) / SWEEP_FILE
    rule = default_workers()
    fallback = f"the cores but one, 1 to {MAX_DEFAULT_WORKERS}"
    data = _read(path)
    if data is None:
        return WorkerChoice(rule, f"{fallback}: no worker sweep in {path} (`make bench` runs one)")
    if data.get("machine") != machine():
        return WorkerChoice(
            rule, f"{fallback}: {path} was measured on another machine ({data.get('machine')})"
        )
    best = {
        m: s["best"]
        for m, s in data["models"].items()
        if isinstance(s, dict) and isinstance(s.get("best"), int) and s["best"] >= 1
    }
    for model in models:
        if model in best:
            return WorkerChoice(best[model], f"bench measured it best for {model} ({path})")
    if best:
        count, _ = Counter(best.values()).most_common(1)[0]
        return WorkerChoice(count, f"bench's most common best ({', '.join(best)}; {path})")
    return WorkerChoice(rule, f"{fallback}: {path} holds no result")


def markdown(bench_dir: Path) -> str:
    """The sweep's rows for bench.md: req/s and p50 per count and level, the best marked."""
    path = Path(bench_dir) / SWEEP_FILE
    data = _read(path)
    if data is None or not data["models"]:
        return ""
    here = data.get("machine") or {}
    rows = [
        "#### KServe runtime: worker processes (the count `pipeline serve` uses by default)",
        "",
        f"Machine: {here.get('cpu')}, {here.get('cores')} cores. Binary bodies, each count "
        f"its own private runtime, best = most req/s over the levels, each relative to its "
        f"level's best (within {TIE:.0%}: the fewest workers). From " + SWEEP_FILE + ".",
        "",
        "| model | format | workers × threads | concurrency | req/s | p50 ms | p99 ms | best |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for model, found in data["models"].items():
        for p in found.get("points", []):
            mark = "◀" if p["workers"] == found.get("best") else ""
            rows.append(
                f"| {model} | {found.get('format')} | {p['workers']} × {p['threads']} | "
                f"{p['concurrency']} | {p['throughput']:.1f} | {p['median_ms']:.2f} | "
                f"{p['p99_ms']:.2f} | {mark} |"
            )
    return "\n".join(rows)
