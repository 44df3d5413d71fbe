"""Which AOTInductor settings make `.pt2` fastest on this machine: bench measures it once
per machine, as it measures the KServe worker count, and export reads it.

Each candidate (`CANDIDATES`: the built-in settings, then one change each that the study
in docs/measurements/pt2-python-2026-11-26.md found to pay on some model) compiles the
model's package, checked against eager on the export's probes like any package, and the
packages are timed interleaved through the same call serving uses
(`runners.lean_call`), at batch 1 and 32. A candidate's score is its speed relative to
the built-in settings, averaged over the batches and the models swept. The best is kept
only when it beats the built-in settings by more than TIE; a measured tie keeps them.

The result goes to `<bench dir>/pt2_settings.json` with the machine it was measured on.
`pipeline export` compiles `.pt2` with it on that machine (the CPU model and cores), and
with the built-in settings elsewhere; the manifest records the settings and where they
came from.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.fileio import write_json
from pipeline.core.pt2settings import SETTINGS_FILE, machine

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel

log = logging.getLogger(__name__)

DEFAULT = "built-in"
# Changes to the built-in settings (pipeline.formats.pt2.INDUCTOR_CONFIGS), one each.
CANDIDATES: dict[str, dict[str, Any]] = {
    DEFAULT: {},
    "stack allocation": {"aot_inductor.allow_stack_allocation": True},
    "runtime constant folding": {"aot_inductor.use_runtime_constant_folding": True},
    "both": {
        "aot_inductor.allow_stack_allocation": True,
        "aot_inductor.use_runtime_constant_folding": True,
    },
}
BATCHES = (1, 32)
# Swept when bench measures them: a CNN, and a tiny model where the call's overhead shows.
MODELS = ("digits_lenet", "my_decision_gate")
TIE = 0.03  # within 3% of the built-in settings is a tie: they stay
ROUNDS = 5


def sweep(exported: ExportedModel, *, repeat: int = 300) -> dict[str, Any]:
    """Every candidate compiled for `exported`'s model and timed: {points, compile_s}."""
    from pipeline.bench.inprocess import Runner, measure_interleaved, timed
    from pipeline.formats.pt2 import to_pt2
    from pipeline_runtime import runners

    example, _ = exported.golden()
    tol = exported.manifest.tolerance
    calls: dict[str, Any] = {}
    compile_s: dict[str, float] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pt2-settings-") as folder:
        for name, change in CANDIDATES.items():
            path = Path(folder) / f"{len(calls)}.pt2"
            log.info("%s: compiling .pt2 with %s settings", exported.name, name)
            try:
                result = to_pt2(
                    exported.model,
                    example,
                    exported.probes(),
                    exported.entry,
                    path,
                    atol=tol.atol,
                    rtol=tol.rtol,
                    configs=change,
                )
            except Exception as err:  # noqa: BLE001 - a candidate that fails is left out, said
                failed[name] = " ".join(str(err).split())[:200]
                log.warning("%s: %s settings left out: %s", exported.name, name, failed[name])
                continue
            compile_s[name] = round(result.compile_seconds, 1)
            calls[name] = runners.load(
                "pt2",
                path,
                inputs=exported.manifest.input_names,
                outputs=exported.manifest.output_names,
                threads=1,
            )
        points = []
        for batch in BATCHES:
            args = exported.sample(batch, seed=0)
            timers = {
                n: Runner(n, timed(lambda r=r, a=args: r(a), threads=1), {})
                for n, r in calls.items()
            }
            rounds = measure_interleaved(timers, warmup=20, repeat=repeat, rounds=ROUNDS)
            for name, per_round in rounds.items():
                median = statistics.median(r["p50_ms"] for r in per_round)
                points.append({"settings": name, "batch": batch, "median_ms": median})
    return {"points": points, "compile_s": compile_s, "failed": failed}


def phase(
    bench_dir: Path, models: list[str], exported_of: Callable[[str], ExportedModel], done: Any
) -> Path | None:
    """bench's phase: sweep those of `models` in MODELS, write the file (None: none)."""
    results = {}
    for model in (m for m in models if m in MODELS):
        results[model] = sweep(exported_of(model))
        done(f"{model} .pt2 settings sweep")
    return write(bench_dir, results) if results else None


def best_of(results: dict[str, dict[str, Any]]) -> str:
    """The candidate with the best speed relative to the built-in settings, averaged over
    every model and batch swept; the built-in settings unless it beats them by > TIE."""
    ratios: dict[str, list[float]] = {}
    for found in results.values():
        base = {p["batch"]: p["median_ms"] for p in found["points"] if p["settings"] == DEFAULT}
        for p in found["points"]:
            if p["batch"] in base:
                ratios.setdefault(p["settings"], []).append(base[p["batch"]] / p["median_ms"])
    if DEFAULT not in ratios:
        return DEFAULT
    whole = [n for n, r in ratios.items() if len(r) == len(ratios[DEFAULT])]  # ran everywhere
    best = max(whole, key=lambda n: statistics.mean(ratios[n]))
    return best if statistics.mean(ratios[best]) > 1 + TIE else DEFAULT


def write(bench_dir: Path, results: dict[str, dict[str, Any]]) -> Path:
    best = best_of(results)
    data = {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "best": best,
        "configs": CANDIDATES[best],
        "models": results,
    }
    return write_json(Path(bench_dir) / SETTINGS_FILE, data)


def markdown(bench_dir: Path) -> str:
    """The sweep's rows for bench.md."""
    path = Path(bench_dir) / SETTINGS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    rows = [
        "#### .pt2: AOTInductor settings (what `pipeline export` compiles with on this machine)",
        "",
        f"Machine: {data['machine'].get('cpu')}, {data['machine'].get('cores')} cores; "
        f"chosen: {data['best']} {json.dumps(data['configs'])}. Medians of {ROUNDS} "
        "interleaved rounds, 1 thread, through the call serving uses; a tie within "
        f"{TIE:.0%} keeps the built-in settings. From {SETTINGS_FILE}.",
        "",
        "| model | settings | batch | median ms | vs built-in | compile s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for model, found in data["models"].items():
        base = {p["batch"]: p["median_ms"] for p in found["points"] if p["settings"] == DEFAULT}
        for p in found["points"]:
            speed = base.get(p["batch"], float("nan")) / p["median_ms"]
            rows.append(
                f"| {model} | {p['settings']} | {p['batch']} | {p['median_ms']:.4f} | "
                f"{speed:.2f}× | {found['compile_s'].get(p['settings'], '')} |"
            )
        for name, why in found.get("failed", {}).items():
            rows.append(f"| {model} | {name} | – | failed: {why} | | |")
    return "\n".join(rows)
