"""`pipeline bench`: every backend side by side on the same inputs, in one run.

In-process backends (eager, each format the export holds as the registry
loads it, frozen TorchScript, ONNX in other opsets, the C++ client on every
format it runs) are measured in interleaved rounds per model and batch size
(backends.py builds them, inprocess.py times them); served ones (TorchServe
per format, dynamic batching off, on and old, several concurrency levels) on
private servers (served.py); then peers (peers/): a bare aiohttp + ONNX
Runtime yardstick and LitServe beside our runtime, on the same ONNX file.
Outputs, all under the bench folder: `bench.json` (machine, matmul peak, every
cell, served and peer rows, targets, the precision table), `bench.md`, PNG
charts (a third, precision.png, when an export holds int8/float16 formats), and
`fastest.json`: each model's fastest backend among those that passed
verification in this run, and the format it runs. Bench never writes into an
export: export is the manifest's only writer.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.bench import pt2profile, pt2settings
from pipeline.bench.config import DEFAULT_MODELS as DEFAULT_MODELS
from pipeline.bench.config import SERVED_MODELS as SERVED_MODELS
from pipeline.bench.config import BenchConfig, BenchResult
from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.fileio import write_json
from pipeline.serving import runtime

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel

log = logging.getLogger(__name__)


def _threads(config: BenchConfig) -> int:
    import psutil

    return config.threads or psutil.cpu_count(logical=False) or 1


def _verified(exported: ExportedModel, cpp_binary: Path | None) -> set[str]:
    """Backends that pass parity with eager for this export, checked now.

    The C++ client is the one the bench built at its start: left to itself,
    verify would rebuild it mid-run whenever its sources changed.
    """
    from pipeline.bench.backends import EAGER
    from pipeline.verify import VerifyConfig, verify
    from pipeline.verify.backends import CPP, cpp_backend_name

    formats = exported.formats()
    # CPP runs the client on every format it can (rows "cpp", "cpp/pt2", ...).
    runs_cpp = cpp_binary is not None and any(f.cpp or f.native for f in formats)
    report = verify(
        VerifyConfig(
            model=exported.name,
            export_dir=exported.dir,
            backends=(*(f.backend for f in formats), *((CPP,) if runs_cpp else ())),
            report=paths.report_path(exported.name, export=exported.dir),  # as verify's
            cpp_binary=cpp_binary,
        ),
        exported=exported,
    )
    # Verify's rows that are bench backends too: verify and bench name them alike.
    benched = {f.backend for f in formats} | {
        cpp_backend_name(f) for f in formats if f.cpp or f.native
    }
    failed = {r.backend for r in report.failures}
    ran = {r.backend for r in report.rows}
    return {EAGER} | ((ran - failed) & benched)


def run_bench(config: BenchConfig) -> BenchResult:
    from pipeline.bench import backends, footprint, inprocess, machine, pareto, report
    from pipeline.bench.fastest import FASTEST_NAME, fastest_of, write_fastest
    from pipeline.bench.peers import bench_peers
    from pipeline.bench.peers.targets import markdown as peers_markdown
    from pipeline.bench.peers.targets import peer_targets
    from pipeline.bench.targets import targets
    from pipeline.export.opened import open_export
    from pipeline.formats import base as registry

    t_start = time.monotonic()
    # Every export first: a missing one was found after the others' minutes of measuring.
    missing = [m for m in config.models if not (config.export_dir(m) / "manifest.json").is_file()]
    if missing:
        raise PipelineError(
            f"No export of {', '.join(missing)} in {config.export_dir(missing[0]).parent.parent}; "
            f"run `pipeline export --model {missing[0]}` for each (or `make bench`, which "
            "exports what is missing)."
        )
    out_dir = config.bench_dir()
    threads = _threads(config)
    info = machine.machine_info()
    cpp_binary = None
    if config.cpp:  # built before any measurement: a compile in the background skews them
        from pipeline.formats.cpp import ensure_built

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

    opened: dict[str, ExportedModel] = {}  # each export opened once (eager model, manifest)

    def exported_of(model: str) -> ExportedModel:
        if model not in opened:
            opened[model] = open_export(config.export_dir(model))
        return opened[model]

    all_cells: list[dict] = []
    skipped: list[dict] = []
    fastest: dict[str, Any] = {}
    for model in config.models:
        exported = exported_of(model)
        verified = _verified(exported, cpp_binary)
        model_cells = []
        flops_model = exported.entry.name.startswith("digits") or model.startswith("torchvision:")
        for batch in config.batches:
            log.info("%s batch %d: in-process backends, interleaved", model, batch)
            runners = backends.runners(
                exported,
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
            if "pt2" in runners and "skipped" not in runners["pt2"].settings:
                runners["pt2"].settings["profile"] = pt2profile.top_ops(runners["pt2"].measure)
            flops = None
            if flops_model:  # CNNs: GFLOP/s against the matmul peak
                sample = exported.sample(batch, seed=backends.SEED)
                flops = inprocess.model_flops(exported.model, list(sample.values()))
            settings = {name: r.settings for name, r in runners.items()}
            skipped += [
                {"model": model, "batch": batch, "backend": n, "why": s["skipped"]}
                for n, s in settings.items()
                if "skipped" in s
            ]
            for c in inprocess.cells(model, batch, threads, latencies, flops, peak, settings):
                runner = runners[c.backend]
                model_cells.append(
                    asdict(c)
                    | {"format": runner.format, "verified": runner.verified_as in verified}
                )
        all_cells += model_cells
        if config.write_fastest:
            fastest[model] = fastest_of(model_cells, exclude_suffix=inprocess.ONE_THREAD)
        phase_done(f"{model} in-process (verify + every batch size)")

    # The served workers run one thread each: their in-process twins, for the
    # added-latency comparison (same threads, so the difference is serving).
    for model in config.served_models if threads > 1 else ():
        twins = {
            f"{n}{inprocess.ONE_THREAD}": r
            for n, r in backends.format_runners(exported_of(model), 1, 1).items()
            if "skipped" not in r.settings
        }
        rounds = inprocess.measure_interleaved(
            twins,
            warmup=config.warmup,
            repeat=config.repeat,
            rounds=config.rounds,
            time_budget_s=config.time_budget_s,
        )
        settings = {n: {**r.settings, "intra_op_threads": 1} for n, r in twins.items()}
        for c in inprocess.cells(model, 1, 1, rounds, None, None, settings):
            # Latency only, against the served workers; never ranked for fastest.json.
            all_cells.append(asdict(c) | {"format": twins[c.backend].format, "verified": True})
        phase_done(f"{model} in-process, one thread (the served workers' twins)")

    served: list[dict] = []
    chosen = footprint.chosen(config.runtimes)
    settings = runtime.BenchSettings(
        concurrencies=config.concurrencies,
        requests_per_level=config.served_requests,
        batching=config.batching,
        level_budget_s=config.served_level_budget_s,
        tune=config.tune,
        out_dir=out_dir,
        formats=registry.full_precision_keys(),
    )
    for model in config.served_models:
        for rt in chosen:
            log.info("%s: %s, concurrency %s", model, rt.title, config.concurrencies)
            points, left_out = rt.bench(model, exported_of(model), settings)
            served += [p.to_json() for p in points]
            skipped += left_out
            phase_done(f"{model} served by {rt.title}")

    peers: list[dict] = []
    peer_settings: dict[str, dict] = {}
    ours: list[str] = []
    for model in (m for m in config.peer_models if m in config.served_models):
        log.info("%s: peers (yardstick, LitServe) beside our runtime, one ONNX file", model)
        run = bench_peers(
            model,
            exported_of(model),
            runtimes=config.runtimes,
            requests=config.peer_requests,
            level_budget_s=config.served_level_budget_s,
            rounds=config.peer_rounds,
            tuned_in=out_dir if config.tune else None,
        )
        peers += [p.to_json() for p in run.points]
        skipped += run.skipped
        peer_settings.update(run.settings)
        ours = run.ours
        phase_done(f"{model} peers")

    if config.pt2_sweep:  # issue 42: the AOTInductor settings `pipeline export` uses here
        pt2settings.phase(out_dir, config.models, exported_of, phase_done)
    peer_models = [m for m in config.peer_models if m in config.served_models and config.footprint]
    measured = footprint.phase(
        tuple(peer_models),
        exported_of,
        requests=config.peer_requests,
        skipped=skipped,
        budget_s=config.served_level_budget_s,
        rounds=config.peer_rounds,
        done=phase_done,
        wanted=config.runtimes,
    )
    pareto_rows = [r for m in config.models for r in pareto.rows(m, exported_of(m), all_cells)]

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
            **{k: getattr(config, k) for k in ("warmup", "repeat", "rounds")},
            "served_requests_per_level": config.served_requests,
            "served_level_budget_s": config.served_level_budget_s,
            "served_workers_and_threads": "pipeline serve defaults (serve.worker_plan)",
        },
        "cells": all_cells,
        "served": served,
        "peers": peers,
        "peer_settings": peer_settings,
        **measured,  # footprint, tracing, tracing_targets (issue 40)
        "fastest": fastest,
        # Issue 29: per model and format, speed, size and task-level accuracy (pareto.py).
        "pareto": pareto_rows,
        "skipped": skipped,
        "duration_s": round(time.monotonic() - t_start, 1),
        "phase_seconds": phases,
    }
    data["targets"] = targets(all_cells, served, peak)
    # Issue 28's targets: printed as PASS/MISS lines, with where the time goes.
    data["peer_targets"] = peer_targets(all_cells, served, peers, ours)
    json_path = write_json(out_dir / "bench.json", data)
    fastest_path = write_fastest(out_dir / FASTEST_NAME, fastest) if config.write_fastest else None
    cells = [inprocess.Cell.of(c) for c in all_cells]
    md = "\n\n".join(
        part
        for part in (
            report.to_markdown(cells, info, peak),
            report.fastest_markdown(fastest),
            pareto.markdown(pareto_rows),
            report.served_markdown(served),
            *(rt.bench_report.notes(out_dir) for rt in chosen if rt.bench_report),
            peers_markdown(peers, peer_settings, data["peer_targets"]),
            footprint.markdown(measured),
            pt2settings.markdown(out_dir) if config.pt2_sweep else "",
            report.targets_markdown(data["targets"]),
            report.skipped_markdown(skipped),
        )
        if part
    )
    md_path = out_dir / "bench.md"
    md_path.write_text(md + "\n")
    charts = [report.latency_chart(cells, out_dir / "latency.png")]
    if served:
        charts.append(report.throughput_chart(served, out_dir / "throughput.png"))
    precision_chart = pareto.chart(pareto_rows, out_dir / "precision.png")
    if precision_chart is not None:
        charts.append(precision_chart)
    return BenchResult(json_path, md_path, charts, data, fastest_path)
