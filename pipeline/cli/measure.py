"""The `pipeline` subcommands that build and time: build-cpp, latency, bench.

Like the rest of the CLI, this only parses arguments and calls a stage function.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.args import terminated_as_exit
from pipeline.core import argtypes, paths

if TYPE_CHECKING:
    import torch

    from pipeline.export.opened import ExportedModel


def add_cpp_commands(sub: argparse._SubParsersAction) -> None:
    from pipeline.formats import base as registry

    cpp_formats = [f for f in registry.declared() if f.cpp]  # what the C++ client runs
    p = sub.add_parser(
        "build-cpp",
        help="build the LibTorch C++ client (cpp_client/), or with --runner pte the ExecuTorch "
        "runner (cpp_client/pte_runner/, no LibTorch)",
        description="Configure and build cpp_client/ with CMake, passing the flags the torch "
        "wheel's LibTorch needs (prefix path, CUDA toolkit, nvrtc); with --runner pte, build "
        "the ExecuTorch runner from the executorch wheel alone and print what a device must "
        "carry (its size, the libraries it loads, and that none is libtorch).",
    )
    p.add_argument(
        "--runner",
        choices=("libtorch", "pte"),
        default="libtorch",
        help="libtorch: the client of TorchScript and .pt2 (default); pte: ExecuTorch's runner",
    )
    p.add_argument(
        "--build-dir",
        type=Path,
        help="default: cpp_client/build (pte: cpp_client/pte_runner/build)",
    )
    p.add_argument("--jobs", type=int, help="parallel compile jobs (default: all cores)")
    p.set_defaults(func=_cmd_build_cpp)

    p = sub.add_parser(
        "latency",
        help="time the C++ client against Python on the same artifact at batch 1, in one run",
        description="Interleaved rounds of the LibTorch client and Python on the same artifact "
        f"({' or '.join(f.title for f in cpp_formats)}) on the golden input's first sample; "
        "prints p50/p90 and the C++/Python ratio (builds the client if needed).",
    )
    p.add_argument(
        "--format",
        choices=[f.key for f in cpp_formats],
        default=cpp_formats[0].key,
        help=f"the artifact both run (default: {cpp_formats[0].key}); the export must hold it, "
        f"e.g. from `pipeline export --format {cpp_formats[-1].key}`",
    )
    p.add_argument(
        "--model", action="append", required=True, help="an exported model; repeat for several"
    )
    p.add_argument(
        "--threads", type=argtypes.positive_int, default=1, help="intra-op threads (default: 1)"
    )
    p.add_argument("--warmup", type=int, default=20, help="default: 20")
    p.add_argument(
        "--repeat",
        type=argtypes.positive_int,
        default=200,
        help="timed runs per round (default: 200)",
    )
    p.add_argument(
        "--rounds", type=argtypes.positive_int, default=3, help="interleaved rounds (default: 3)"
    )
    p.add_argument("--json", type=Path, help="also write the results as JSON")
    p.add_argument(
        "--cpp-build-dir",
        type=Path,
        help="the C++ client's build folder, as given to `pipeline build-cpp --build-dir`; "
        "built there when missing or older than its sources (default: cpp_client/build)",
    )
    p.set_defaults(func=_cmd_latency)


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    from pipeline.bench import DEFAULT_MODELS, SERVED_MODELS, BenchConfig

    defaults = BenchConfig()  # one place for the defaults: the config the CLI fills in

    p = sub.add_parser(
        "bench",
        help="measure every backend side by side (in-process and served); JSON, Markdown, charts",
        description="Interleaved rounds of eager, every format the export holds (TorchScript "
        "plain and frozen, ONNX Runtime, the .pt2 package and the ExecuTorch .pte program when "
        "exported) and the C++ client on each format it runs (ExecuTorch's own runner on the "
        ".pte), at each batch size, then TorchServe per format at each concurrency "
        "with dynamic batching off, on (the archive defaults) and old (batch 8, 10 ms), "
        "TorchServe's own port beside the gateway at concurrency 1, and the KServe runtime "
        "(Open Inference Protocol) on the same exports and levels, with the worker count it "
        "measured best first (kserve_workers.json, which `pipeline serve --runtime kserve` "
        "reads), and the Ray Serve runtime on a one-node local cluster, then peers on the "
        "digits CNN's ONNX file: a bare aiohttp + ONNX Runtime yardstick and LitServe (the "
        "`bench` extra) beside the runtimes, with PASS/MISS target "
        "lines and each of our rows' own server split (decode, queue, compute, encode), then "
        "each runtime's cold start and worker memory per format and what tracing costs. Writes <artifacts>/bench/bench.json, bench.md, "
        "latency.png and throughput.png, and fastest.json: each model's fastest verified backend "
        "and its format, which `pipeline archive`, `pipeline serve` (every runtime) and "
        "`deploy kserve` read to pick the format they serve. Exports are never modified.",
    )
    p.add_argument(
        "--model",
        action="append",
        help=f"exported model(s) to measure in-process (default: {' '.join(DEFAULT_MODELS)})",
    )
    p.add_argument(
        "--serve-model",
        action="append",
        help=f"model(s) to measure served, by every --runtime (default: {' '.join(SERVED_MODELS)}; 'none' for none)",
    )
    p.add_argument(
        "--batch",
        type=argtypes.positive_int,
        action="append",
        help="batch sizes (default: 1 and 32)",
    )
    p.add_argument(
        "--threads",
        type=argtypes.positive_int,
        help="in-process intra-op threads (default: physical cores)",
    )
    p.add_argument(
        "--rounds",
        type=argtypes.positive_int,
        default=defaults.rounds,
        help=f"interleaved rounds (default: {defaults.rounds})",
    )
    p.add_argument(
        "--repeat",
        type=argtypes.positive_int,
        default=defaults.repeat,
        help=f"timed calls per backend per round (default: {defaults.repeat})",
    )
    p.add_argument(
        "--served-requests",
        type=argtypes.positive_int,
        default=defaults.served_requests,
        help=f"per concurrency level, at most {defaults.served_level_budget_s:g} s each "
        f"(default: {defaults.served_requests})",
    )
    p.add_argument("--no-cpp", action="store_true", help="leave the C++ client out")
    p.add_argument(
        "--no-worker-sweep",
        action="store_true",
        help="measure the runtimes with their defaults, without first measuring which worker "
        "count serves best (the sweep, about a minute per served model, writes "
        "kserve_workers.json, which `pipeline serve --runtime kserve` reads)",
    )
    p.add_argument(
        "--no-pt2-sweep",
        action="store_true",
        help="do not measure which AOTInductor settings compile the fastest .pt2 here (the "
        "sweep compiles each candidate for digits_lenet and my_decision_gate, about a minute "
        "each, and writes pt2_settings.json, which `pipeline export` reads)",
    )
    from pipeline.serving import runtime

    p.add_argument(
        "--runtime",
        action="append",
        choices=runtime.names(),
        metavar="NAME",
        help="a runtime to measure serving the --serve-model models (repeatable; default: every "
        f"one: {', '.join(runtime.names())})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="digits only, few runs, no worker sweep (about a minute): checks the output, not "
        "speed, so it writes no fastest.json for archive and serve to follow",
    )
    p.add_argument("--out-dir", type=Path, help="default: <artifacts>/bench")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pipeline.bench import BenchConfig, run_bench

    overrides: dict = {"out_dir": args.out_dir, "artifacts_root": args.artifacts_dir}
    if args.model:
        overrides["models"] = tuple(args.model)
    if args.serve_model:
        overrides["served_models"] = tuple(m for m in args.serve_model if m != "none")
    if args.batch:
        overrides["batches"] = tuple(args.batch)
    if args.threads:
        overrides["threads"] = args.threads
    if args.no_cpp:
        overrides["cpp"] = False
    if args.runtime:
        overrides["runtimes"] = tuple(args.runtime)
    if args.no_worker_sweep:
        overrides["tune"] = False
    if args.no_pt2_sweep:
        overrides["pt2_sweep"] = False
    if args.quick:
        config = BenchConfig.quick(**overrides)
    else:
        config = BenchConfig(
            rounds=args.rounds,
            repeat=args.repeat,
            served_requests=args.served_requests,
            **overrides,
        )
    started = time.time()
    with terminated_as_exit():  # its private servers stopped on a SIGTERM too
        result = run_bench(config)
    print(result.markdown_path.read_text())
    written = [result.json_path, result.markdown_path, *result.charts]
    more = (result.fastest_path, result.json_path.parent / "kserve_workers.json")
    written += [p for p in more if p is not None and p.is_file() and p.stat().st_mtime >= started]
    print("wrote " + ", ".join(map(str, written)))
    return 0


def _cmd_latency(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pipeline.export.opened import open_export
    from pipeline.formats import base as registry
    from pipeline.formats.cpp import compare_latency, ensure_built

    fmt = registry.get(args.format)
    table = Table(title=f"{fmt.title} latency at batch 1: LibTorch C++ vs Python (same run)")
    for col in (
        "model",
        "threads",
        "C++ p50 ms",
        "C++ p90 ms",
        "Python p50 ms",
        "Python p90 ms",
        "C++ / Python",
    ):
        table.add_column(col, justify="left" if col == "model" else "right")
    results = []
    for model in args.model:
        exported = open_export(paths.export_dir(model, args.artifacts_dir))
        golden, _ = exported.golden()
        result = compare_latency(
            exported.path(fmt.key),
            _first_sample(exported, golden),
            threads=args.threads,
            warmup=args.warmup,
            repeat=args.repeat,
            rounds=args.rounds,
            op_libraries=exported.manifest.artifact(fmt.key).get("op_libraries") or (),
            binary=ensure_built(args.cpp_build_dir),
        )
        result["model"] = model
        result["format"] = fmt.key
        results.append(result)
        c, p = result["cpp"], result["python"]
        table.add_row(
            model,
            str(args.threads),
            f"{c['p50_ms']:.3f}",
            f"{c['p90_ms']:.3f}",
            f"{p['p50_ms']:.3f}",
            f"{p['p90_ms']:.3f}",
            f"{result['cpp_over_python_p50']:.2f}×",
        )
    Console(width=150).print(table)
    if args.json:
        from pipeline.core.fileio import write_json

        write_json(args.json, results)
    return 0


def _first_sample(exported: ExportedModel, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """INPUTS in forward() order, cut to one sample along each input's declared batch axis."""
    out = []
    for record in exported.manifest.inputs:
        tensor = inputs[record.name]
        axis = record.batch_axis
        # contiguous: a .pt2 checks strides against the exported ones
        out.append((tensor if axis is None else tensor.narrow(axis, 0, 1)).contiguous())
    return out


def _cmd_build_cpp(args: argparse.Namespace) -> int:
    if args.runner == "pte":
        from pipeline.formats import pte_runner

        binary = pte_runner.build(args.build_dir, args.jobs)
        size = pte_runner.footprint(binary)
        mib = size["total_bytes"] / 2**20
        print(f"built {binary}")
        print(
            f"  runner {size['runner_bytes'] / 1024:.0f} KiB + ExecuTorch libraries "
            f"({', '.join(sorted(size['libraries']))}) = {mib:.1f} MiB; "
            f"libtorch linked: {', '.join(size['libtorch']) or 'none'}"
        )
        return 0
    from pipeline.formats.cpp import build

    print(f"built {build(args.build_dir, args.jobs)}")
    return 0
