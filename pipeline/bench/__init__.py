"""`pipeline bench`: every backend side by side on the same inputs, in one run.

In-process backends (eager, TorchScript plain and frozen, ONNX Runtime, the
AOTInductor .pt2, the C++ client on TorchScript and on the .pt2) are measured
in interleaved rounds per model and batch size (inprocess.py); served ones
(TorchServe per format, dynamic batching off and on, several concurrency
levels) on private servers (served.py). Outputs:
`bench.json` (machine, matmul peak, every cell, targets), `bench.md`, and
two PNG charts. Each model's manifest then names its fastest backend among
those that passed verification in this run.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline import paths
from pipeline.errors import PipelineError
from pipeline.fileio import write_json
from pipeline.manifest import read_manifest

log = logging.getLogger(__name__)

DEFAULT_MODELS = (
    "digits_lenet",
    "torchvision:resnet18",
    "my_decision_gate",
    "my_cell",
    "my_rnn_loop",
    "wrap_rnn",
)
SERVED_MODELS = ("digits_lenet", "torchvision:resnet18")
ONE_THREAD = " (1 thread)"  # suffix of the in-process twins of the single-threaded workers
# Verify's report rows that are also bench backends (the names are the same).
_VERIFIED_BACKENDS = frozenset({"torchscript", "onnxruntime", "pt2", "cpp", "cpp/pt2"})
# served format → its in-process counterpart, for the serving-cost targets
_SERVED_VS_INPROCESS = (("torchscript", "torchscript"), ("onnx", "onnxruntime"), ("pt2", "pt2"))


@dataclass
class BenchConfig:
    models: tuple[str, ...] = DEFAULT_MODELS
    served_models: tuple[str, ...] = SERVED_MODELS
    batches: tuple[int, ...] = (1, 32)
    threads: int | None = None  # intra-op threads in-process; default: physical cores
    warmup: int = 10
    repeat: int = 30
    rounds: int = 3
    concurrencies: tuple[int, ...] = (1, 8, 32)
    batching: tuple[str, ...] = ("off", "on")
    # 200 requests a level still give the p99 from two samples above it; the
    # digits CNN's levels end on this count (1-4 s each).
    served_requests: int = 200
    # No new requests after this long at one level: resnet18 answers 8-40 a second
    # here, so its levels end on time, not on count (30-160 requests at 4 s). Three
    # formats × two batching settings × three levels: a third of `make bench`.
    served_level_budget_s: float = 4.0
    cpp: bool = True
    out_dir: Path | None = None  # default: <artifacts>/bench
    artifacts_root: Path | None = None
    # Per model and batch size, in-process. Only resnet18 reaches it (seven backends
    # at up to 1.5 s a call at batch 32); the small models end on `repeat`.
    time_budget_s: float = 45.0
    update_manifest: bool = True
    # ONNX opsets compared with the exported one (18) on the CNNs at batch 1; 20 is
    # the exporter's default, whose AveragePool ran slower here.
    opsets: tuple[int, ...] = (20,)
    # Export folders by model, where they are not <artifacts>/<model>/export.
    export_dirs: dict[str, Path] = field(default_factory=dict)

    def export_dir(self, model: str) -> Path:
        return Path(self.export_dirs.get(model) or paths.export_dir(model, self.artifacts_root))

    @classmethod
    def quick(cls, **kw: Any) -> BenchConfig:
        """Seconds, not minutes: the shape of the output, not its figures."""
        base = dict(
            models=("digits_lenet",),
            served_models=("digits_lenet",),
            batches=(1,),
            warmup=2,
            repeat=5,
            rounds=2,
            concurrencies=(1, 8),
            batching=("on",),
            served_requests=16,
            cpp=False,
            opsets=(),
            time_budget_s=10.0,
        )
        return cls(**{**base, **kw})


@dataclass
class BenchResult:
    json_path: Path
    markdown_path: Path
    charts: list[Path]
    data: dict[str, Any] = field(default_factory=dict)


def _threads(config: BenchConfig) -> int:
    import psutil

    return config.threads or psutil.cpu_count(logical=False) or 1


def _verified(export_dir: Path, cpp_binary: Path | None) -> set[str]:
    """Backends that pass parity with eager for this export, checked now.

    The C++ client is the one the bench built at its start: left to itself,
    verify would rebuild it mid-run whenever its sources changed.
    """
    from pipeline.verify import VerifyConfig, verify
    from pipeline.verify.backends import local_backends

    manifest = read_manifest(export_dir)
    # "cpp" runs the client on every format it can (rows "cpp" and "cpp/pt2").
    backends = (*local_backends(manifest), *(("cpp",) if cpp_binary else ()))
    report = verify(
        VerifyConfig(
            model=manifest["model"]["name"],
            export_dir=export_dir,
            backends=backends,
            report=export_dir.parent / "parity.json",  # where `pipeline verify` puts it
            cpp_binary=cpp_binary,
        )
    )
    failed = {r.backend for r in report.failures}
    ran = {r.backend for r in report.rows}
    return {"eager"} | ((ran - failed) & _VERIFIED_BACKENDS)


def _targets(cells: list[dict], served: list[dict], peak: float) -> list[dict[str, Any]]:
    def cell(model: str, backend: str, batch: int) -> dict | None:
        return next(
            (
                c
                for c in cells
                if c["model"] == model and c["backend"] == backend and c["batch"] == batch
            ),
            None,
        )

    out: list[dict[str, Any]] = []
    r32 = [c for c in cells if c["model"] == "torchvision:resnet18" and c["batch"] == 32]
    r32 = [c for c in r32 if c.get("verified") and c.get("peak_fraction") is not None]
    if r32:
        best = max(r32, key=lambda c: c["peak_fraction"])
        out.append(
            {
                "target": "resnet18 batch 32: fastest verified backend ≥ 85% of fp32 matmul peak",
                "value": best["peak_fraction"],
                "detail": f"{best['backend']}: {best['gflops']:.1f} of {peak:.1f} GFLOP/s",
                "met": best["peak_fraction"] >= 0.85,
            }
        )
    for fmt, backend in _SERVED_VS_INPROCESS:
        inproc = cell("torchvision:resnet18", backend, 1)
        at8 = [
            s
            for s in served
            if s["model"] == "torchvision:resnet18"
            and s["backend"] == f"torchserve/{fmt}"
            and s["concurrency"] == 8
            and s["batching"] == "on"
        ]
        if inproc and at8:
            ratio = at8[0]["throughput"] / inproc["throughput"]
            out.append(
                {
                    "target": f"TorchServe/{fmt} at concurrency 8, resnet18: ≥ 85% of in-process {backend} throughput (batch 1)",
                    "value": ratio,
                    "detail": f"{at8[0]['throughput']:.1f} vs {inproc['throughput']:.1f} samples/s",
                    "met": ratio >= 0.85,
                }
            )
    for model in SERVED_MODELS:
        for fmt, backend in _SERVED_VS_INPROCESS:
            inproc = cell(model, f"{backend}{ONE_THREAD}", 1) or cell(model, backend, 1)
            at1 = [
                s
                for s in served
                if s["model"] == model
                and s["backend"] == f"torchserve/{fmt}"
                and s["concurrency"] == 1
                and s["batching"] == "off"
            ]
            if inproc and at1:
                added = at1[0]["median_ms"] - inproc["median_ms"]
                out.append(
                    {
                        "target": f"{model} TorchServe/{fmt} added p50 latency at concurrency 1 ≤ 5 ms (vs in-process, {inproc['threads']} thread(s) like the worker)",
                        "value": added,
                        "detail": f"{at1[0]['median_ms']:.2f} vs {inproc['median_ms']:.2f} ms in-process",
                        "met": added <= 5.0,
                    }
                )
    for model in sorted({c["model"] for c in cells}):
        for batch in (1, 32):
            base = cell(model, "onnxruntime", batch)
            for other in (c for c in cells if c["model"] == model and c["batch"] == batch):
                if not other["backend"].startswith("onnxruntime (opset") or not base:
                    continue
                ratio = base["median_ms"] / other["median_ms"]
                out.append(
                    {
                        "target": f"{model} batch {batch}: the exported ONNX opset is at least as fast as {other['backend'].removeprefix('onnxruntime (').rstrip(')')}",
                        "value": ratio,
                        "detail": f"{base['median_ms']:.3f} ms exported vs {other['median_ms']:.3f} ms",
                        "met": ratio <= 1.05,  # within noise, or faster
                    }
                )
    for s in served:
        if s.get("first_request_ms") is not None:
            ratio = s["first_request_ms"] / s["median_ms"]
            out.append(
                {
                    "target": f"{s['model']} {s['backend']} (batching {s['batching']}): first request after READY ≤ 2× a steady one",
                    "value": ratio,
                    "detail": f"{s['first_request_ms']:.1f} vs {s['median_ms']:.1f} ms p50",
                    "met": ratio <= 2.0,
                }
            )
    for model in sorted({c["model"] for c in cells}):
        for client, python, what in (
            ("cpp", "torchscript", "C++ client latency ≤ 1.05× Python TorchScript"),
            ("cpp/pt2", "pt2", "C++ client latency ≤ 1.05× Python, both on the .pt2"),
        ):
            cpp, py = cell(model, client, 1), cell(model, python, 1)
            if cpp and py:
                ratio = cpp["median_ms"] / py["median_ms"]
                out.append(
                    {
                        "target": f"{model}: {what} (batch 1)",
                        "value": ratio,
                        "detail": f"{cpp['median_ms']:.3f} vs {py['median_ms']:.3f} ms",
                        "met": ratio <= 1.05,
                    }
                )
    return out


def _record_fastest(export_dir: Path, cells: list[dict]) -> dict[str, Any] | None:
    """Name the fastest verified backend at batch 1 in the manifest."""
    from pipeline.fileio import write_json as write

    ranked = sorted(
        (
            c
            for c in cells
            if c["batch"] == 1 and c.get("verified") and not c["backend"].endswith(ONE_THREAD)
        ),
        key=lambda c: c["median_ms"],
    )
    if not ranked:
        return None
    best = ranked[0]
    manifest = read_manifest(export_dir)
    manifest["fastest"] = {
        "backend": best["backend"],
        "batch": 1,
        "median_ms": round(best["median_ms"], 4),
        "ranking": [c["backend"] for c in ranked],
        "measured": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    write(export_dir / "manifest.json", manifest)
    return manifest["fastest"]


def run_bench(config: BenchConfig) -> BenchResult:
    from pipeline.bench import inprocess, machine, report

    t_start = time.monotonic()
    out_dir = Path(config.out_dir or paths.artifacts_root(config.artifacts_root) / "bench")
    threads = _threads(config)
    info = machine.machine_info()
    cpp_binary = None
    if config.cpp:  # built before any measurement: a compile in the background skews them
        from pipeline.cpp import ensure_built

        cpp_binary = ensure_built()
    peak = machine.matmul_peak_gflops(threads)
    log.info("fp32 matmul peak with %d thread(s): %.1f GFLOP/s", threads, peak)
    # Seconds per phase, logged as each ends and kept in the JSON: where the
    # bench's own time goes, for whoever has to make it shorter.
    phases: dict[str, float] = {}
    last = [t_start]

    def phase_done(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(now - last[0], 1)
        last[0] = now
        log.info("%s took %.0f s (%.0f s so far)", name, phases[name], now - t_start)

    phase_done("setup (C++ client, matmul peak)")

    all_cells: list[dict] = []
    skipped: list[dict] = []
    fastest: dict[str, Any] = {}
    for model in config.models:
        export_dir = config.export_dir(model)
        if not (export_dir / "manifest.json").is_file():
            raise PipelineError(
                f"No export of {model} in {export_dir}; run `pipeline export --model {model}` "
                "(or `make bench`, which exports what is missing)."
            )
        verified = _verified(export_dir, cpp_binary)
        from pipeline.verify import load_reference

        manifest = read_manifest(export_dir)
        entry, eager = load_reference(export_dir, manifest)
        model_cells = []
        flops_model = entry.name.startswith("digits") or model.startswith("torchvision:")  # CNNs
        for batch in config.batches:
            log.info("%s batch %d: in-process backends, interleaved", model, batch)
            runners = inprocess.runners(
                export_dir,
                batch,
                threads,
                cpp_binary,
                config.opsets if flops_model and batch == 1 else (),
            )
            latencies = inprocess.measure_interleaved(
                runners,
                warmup=config.warmup,
                repeat=config.repeat,
                rounds=config.rounds,
                time_budget_s=config.time_budget_s,
            )
            flops = None
            if flops_model:
                import torch

                sample = entry.sample_inputs(entry.sizes(batch=batch), torch.Generator())
                flops = inprocess.model_flops(eager, list(sample.values()))
            settings = {name: r.settings for name, r in runners.items()}
            skipped += [
                {"model": model, "batch": batch, "backend": n, "why": s["skipped"]}
                for n, s in settings.items()
                if "skipped" in s
            ]
            for c in inprocess.cells(model, batch, threads, latencies, flops, peak, settings):
                row = asdict(c)
                row["verified"] = c.backend in verified or (
                    c.backend == "torchscript_frozen" and "torchscript" in verified
                )
                if c.backend.startswith("onnxruntime (opset"):
                    row["verified"] = "onnxruntime" in verified  # and matches it (runners())
                model_cells.append(row)
        all_cells += model_cells
        if config.update_manifest:
            fastest[model] = _record_fastest(export_dir, model_cells)
        phase_done(f"{model} in-process (verify + every batch size)")

    # The served workers run one thread each: their in-process twins, for the
    # added-latency comparison (same threads, so the difference is serving).
    for model in config.served_models if threads > 1 else ():
        runners = inprocess.runners(config.export_dir(model), 1, 1)
        twins = {
            f"{n}{ONE_THREAD}": runners[n]
            for n in ("torchscript", "onnxruntime", "pt2")
            if n in runners and "skipped" not in runners[n].settings
        }
        rounds = inprocess.measure_interleaved(
            twins, warmup=config.warmup, repeat=config.repeat, rounds=config.rounds,
            time_budget_s=config.time_budget_s,
        )  # fmt: skip
        settings = {n: {**r.settings, "intra_op_threads": 1} for n, r in twins.items()}
        for c in inprocess.cells(model, 1, 1, rounds, None, None, settings):
            all_cells.append({**asdict(c), "verified": True})
        phase_done(f"{model} in-process, one thread (the served workers' twins)")

    served: list[dict] = []
    if config.served_models:
        from pipeline.bench.served import bench_served

        for model in config.served_models:
            log.info("%s: TorchServe, concurrency %s", model, config.concurrencies)
            points, left_out = bench_served(
                model,
                config.export_dir(model),
                concurrencies=config.concurrencies,
                requests_per_level=config.served_requests,
                batching=config.batching,
                level_budget_s=config.served_level_budget_s,
            )
            served += [p.to_json() for p in points]
            skipped += left_out
            phase_done(f"{model} served")

    # Measured again at the end; the better of the two is the machine's peak (a
    # busy moment can only lower it), and the in-process fractions are rescaled.
    peak_end = machine.matmul_peak_gflops(threads)
    if peak_end > peak:
        for c in all_cells:
            if c.get("peak_fraction") is not None:
                c["peak_fraction"] *= peak / peak_end
        peak = peak_end
    data = {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": info,
        "threads": threads,
        "matmul_peak_gflops": peak,
        "settings": {
            "warmup": config.warmup,
            "repeat": config.repeat,
            "rounds": config.rounds,
            "served_requests_per_level": config.served_requests,
            "served_level_budget_s": config.served_level_budget_s,
            "served_workers_and_threads": "pipeline serve defaults (serve.worker_plan)",
        },
        "cells": all_cells,
        "served": served,
        "fastest": fastest,
        "skipped": skipped,
        "duration_s": round(time.monotonic() - t_start, 1),
        "phase_seconds": phases,
    }
    data["targets"] = _targets(all_cells, served, peak)
    json_path = write_json(out_dir / "bench.json", data)
    md = report.to_markdown([inprocess.Cell(**_cell_fields(c)) for c in all_cells], info, peak)
    md += "\n\n" + _served_markdown(served) + "\n\n" + _targets_markdown(data["targets"])
    md += "\n\n" + _skipped_markdown(skipped)
    md_path = out_dir / "bench.md"
    md_path.write_text(md + "\n")
    charts = [
        report.latency_chart(
            [inprocess.Cell(**_cell_fields(c)) for c in all_cells], out_dir / "latency.png"
        )
    ]
    if served:
        charts.append(report.throughput_chart(served, out_dir / "throughput.png"))
    return BenchResult(json_path, md_path, charts, data)


def _cell_fields(row: dict) -> dict:
    from dataclasses import fields

    from pipeline.bench.inprocess import Cell

    names = {f.name for f in fields(Cell)}
    return {k: v for k, v in row.items() if k in names}


def _table(title: str, header: list[str], align: str, rows: list[list[str]]) -> str:
    """A titled Markdown table, or "" for no rows; `align` has one l or r per column."""
    if not rows:
        return ""
    clean = [[" ".join(str(cell).split()).replace("|", "/") for cell in row] for row in rows]
    lines = [f"#### {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in clean]
    return "\n".join(lines)


def _served_markdown(served: list[dict]) -> str:
    return _table(
        "Served (TorchServe behind the gateway; one single-threaded worker per core; .npy bodies)",
        [
            "model",
            "backend",
            "batching",
            "concurrency",
            "requests",
            "failed",
            "median ms",
            "p90 ms",
            "p99 ms",
            "req/s",
        ],
        "lllrrrrrrr",
        [
            [s["model"], s["backend"], s["batching"], s["concurrency"], s["requests"], s["failed"]]
            + [f"{s[k]:.2f}" for k in ("median_ms", "p90_ms", "p99_ms")]
            + [f"{s['throughput']:.1f}"]
            for s in served
        ],
    )


def _targets_markdown(targets: list[dict]) -> str:
    return _table(
        "Targets",
        ["target", "reached", "detail", "met"],
        "lrll",
        [
            [t["target"], f"{t['value']:.2f}", t["detail"], "yes" if t["met"] else "no"]
            for t in targets
        ],
    )


def _skipped_markdown(skipped: list[dict]) -> str:
    return _table(
        "Skipped",
        ["model", "batch", "backend", "why"],
        "lrll",
        [[s["model"], s["batch"], s["backend"], s["why"]] for s in skipped],
    )
