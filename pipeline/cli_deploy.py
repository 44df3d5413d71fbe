"""The `pipeline` subcommands that deploy an export: archive, serve, stop,
infer (TorchServe) and build-cpp, latency (the LibTorch client).

Like cli.py, this only parses arguments and calls a stage function.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline import paths


def model_arg(p: argparse.ArgumentParser) -> None:
    from pipeline.cli import _model_arg  # shared with the core stages

    _model_arg(p)


def add_cpp_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build-cpp",
        help="build the LibTorch C++ client (cpp_client/) against the installed torch",
        description="Configure and build cpp_client/ with CMake, passing the flags the torch "
        "wheel's LibTorch needs (prefix path, CUDA toolkit, nvrtc).",
    )
    p.add_argument("--build-dir", type=Path, help="default: cpp_client/build")
    p.add_argument("--jobs", type=int, help="parallel compile jobs (default: all cores)")
    p.set_defaults(func=_cmd_build_cpp)

    p = sub.add_parser(
        "latency",
        help="time the C++ client against Python TorchScript (or .pt2) at batch 1, in one run",
        description="Interleaved rounds of the LibTorch client and Python on the same artifact "
        "(TorchScript, or with --format pt2 the AOTInductor package) on the golden input's first "
        "sample; prints p50/p90 and the C++/Python ratio (builds the client if needed).",
    )
    p.add_argument(
        "--format",
        choices=("torchscript", "pt2"),
        default="torchscript",
        help="the artifact both run (default: torchscript; pt2 needs `export --format pt2`)",
    )
    p.add_argument(
        "--model", action="append", required=True, help="an exported model; repeat for several"
    )
    p.add_argument("--threads", type=int, default=1, help="intra-op threads for both (default: 1)")
    p.add_argument("--warmup", type=int, default=20, help="default: 20")
    p.add_argument("--repeat", type=int, default=200, help="timed runs per round (default: 200)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--json", type=Path, help="also write the results as JSON")
    p.set_defaults(func=_cmd_latency)


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    from pipeline.bench import DEFAULT_MODELS, SERVED_MODELS, BenchConfig

    defaults = BenchConfig()  # one place for the defaults: the config the CLI fills in

    p = sub.add_parser(
        "bench",
        help="measure every backend side by side (in-process and served); JSON, Markdown, charts",
        description="Interleaved rounds of eager, TorchScript (plain and frozen), ONNX Runtime, "
        "the .pt2 package (when exported) and the C++ client (on TorchScript and .pt2) at each "
        "batch size, then TorchServe per format at each concurrency with "
        "dynamic batching off and on. Writes <artifacts>/bench/bench.json, bench.md, latency.png "
        "and throughput.png, and names each model's fastest verified backend in its manifest.",
    )
    p.add_argument(
        "--model",
        action="append",
        help=f"exported model(s) to measure in-process (default: {' '.join(DEFAULT_MODELS)})",
    )
    p.add_argument(
        "--serve-model",
        action="append",
        help=f"model(s) to measure through TorchServe (default: {' '.join(SERVED_MODELS)}; 'none' for none)",
    )
    p.add_argument("--batch", type=int, action="append", help="batch sizes (default: 1 and 32)")
    p.add_argument(
        "--threads", type=int, help="in-process intra-op threads (default: physical cores)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=defaults.rounds,
        help=f"interleaved rounds (default: {defaults.rounds})",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=defaults.repeat,
        help=f"timed calls per backend per round (default: {defaults.repeat})",
    )
    p.add_argument(
        "--served-requests",
        type=int,
        default=defaults.served_requests,
        help=f"per concurrency level, at most {defaults.served_level_budget_s:g} s each "
        f"(default: {defaults.served_requests})",
    )
    p.add_argument("--no-cpp", action="store_true", help="leave the C++ client out")
    p.add_argument(
        "--quick", action="store_true", help="digits only, few runs: checks the output, not speed"
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
    if args.quick:
        config = BenchConfig.quick(**overrides)
    else:
        config = BenchConfig(
            rounds=args.rounds,
            repeat=args.repeat,
            served_requests=args.served_requests,
            **overrides,
        )
    result = run_bench(config)
    print(result.markdown_path.read_text())
    print(
        f"wrote {result.json_path}, {result.markdown_path}, " + ", ".join(map(str, result.charts))
    )
    return 0


def _cmd_latency(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pipeline.cpp import compare_latency
    from pipeline.manifest import artifact_path, read_manifest

    what = {"torchscript": "TorchScript", "pt2": ".pt2 (AOTInductor)"}[args.format]
    table = Table(title=f"{what} latency at batch 1: LibTorch C++ vs Python (same run)")
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
        export_dir = paths.export_dir(model, args.artifacts_dir)
        manifest = read_manifest(export_dir)
        golden = torch_load_inputs(artifact_path(export_dir, manifest, "golden"))
        inputs = [t[:1] if t.ndim else t for t in golden]  # batch 1
        result = compare_latency(
            artifact_path(export_dir, manifest, args.format), inputs, threads=args.threads,
            warmup=args.warmup, repeat=args.repeat, rounds=args.rounds,
        )  # fmt: skip
        result["model"] = model
        result["format"] = args.format
        results.append(result)
        c, p = result["cpp"], result["python"]
        table.add_row(model, str(args.threads), f"{c['p50_ms']:.3f}", f"{c['p90_ms']:.3f}",
                      f"{p['p50_ms']:.3f}", f"{p['p90_ms']:.3f}", f"{result['cpp_over_python_p50']:.2f}×")  # fmt: skip
    Console(width=150).print(table)
    if args.json:
        from pipeline.fileio import write_json

        write_json(args.json, results)
    return 0


def torch_load_inputs(path: Path) -> list:
    import torch

    golden = torch.load(path, map_location="cpu", weights_only=True)
    return list(golden["inputs"].values())


def _cmd_build_cpp(args: argparse.Namespace) -> int:
    from pipeline.cpp import build

    print(f"built {build(args.build_dir, args.jobs)}")
    return 0


def run_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-dir",
        type=Path,
        help="where `pipeline serve` keeps its config, logs, token file and pid (default: <artifacts>/serve)",
    )


def add_serving_commands(sub: argparse._SubParsersAction) -> None:
    from pipeline.archive import DEFAULT_STORE, FORMATS

    p = sub.add_parser(
        "archive",
        help="package an export as TorchServe .mar files in model_store/",
        description="Write model_store/<model>_ts.mar and <model>_onnx.mar (artifact, handler, manifest, "
        "golden inputs for warm-up, model-config.yaml).",
    )
    model_arg(p)
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="default: model_store")
    p.add_argument(
        "--format",
        action="append",
        choices=list(FORMATS),
        help="default: every format the export holds",
    )
    p.add_argument("--batch-size", type=int, default=8, help="TorchServe batch size (default: 8)")
    p.add_argument("--max-batch-delay-ms", type=int, default=10, help="default: 10")
    p.add_argument("--min-workers", type=int, default=1, help="default: 1")
    p.add_argument("--max-workers", type=int, default=1, help="default: 1")
    p.add_argument("--response-timeout", type=int, default=30, help="seconds (default: 30)")
    p.add_argument("--startup-timeout", type=int, default=120, help="seconds (default: 120)")
    p.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        help="pin workers to cpu or gpu (default: a GPU when the server has one, else CPU)",
    )
    p.set_defaults(func=_cmd_archive)

    p = sub.add_parser(
        "serve",
        help="start TorchServe over model_store/ with secure defaults",
        description="Start TorchServe on 127.0.0.1 with token authorization on and the model API off; "
        "return once every model is READY (or fail with the worker's log).",
    )
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="default: model_store")
    p.add_argument(
        "--models", nargs="+", metavar="NAME", help="archives to serve (default: all in the store)"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the inference gateway listens on (default: 127.0.0.1; TorchServe itself "
        "always stays on loopback). Any other address prints a warning: use HTTPS then.",
    )
    p.add_argument("--port", type=int, default=8080, help="inference port (default: 8080)")
    p.add_argument("--tls-cert", type=Path, help="serve HTTPS with this PEM certificate chain")
    p.add_argument("--tls-key", type=Path, help="the PEM private key of --tls-cert")
    p.add_argument(
        "--all-formats",
        action="store_true",
        help="serve every format of every model (default: where `pipeline bench` named a model's "
        "fastest verified backend, only that format)",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="serve the models that load even if others fail (default: any failure stops the start)",
    )
    p.add_argument("--management-port", type=int, default=8081, help="default: 8081")
    p.add_argument("--metrics-port", type=int, default=8082, help="default: 8082")
    p.add_argument(
        "--threads-per-worker",
        type=int,
        help="intra-op threads per worker (default: physical cores / all workers, at least 1)",
    )
    p.add_argument(
        "--workers-per-model",
        type=int,
        help="default: physical cores / models served, at least 1",
    )
    p.add_argument(
        "--max-request-size", type=int, default=4 * 1024 * 1024, help="bytes (default: 4 MiB)"
    )
    p.add_argument("--gpu", action="store_true", help="give workers a GPU when CUDA is present")
    run_dir_arg(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("stop", help="stop the TorchServe started by `pipeline serve`")
    run_dir_arg(p)
    p.set_defaults(func=_cmd_stop)

    p = sub.add_parser(
        "infer",
        help="send an image or tensors to a served model and print the answer",
        description="POST a .png/.jpg image, a .json body or a torch.save'd .pt of tensors to "
        "/predictions/<model> with the inference token.",
    )
    p.add_argument(
        "--model", required=True, help="served model (archive) name, e.g. digits_lenet_ts"
    )
    p.add_argument("input", type=Path, help="the file to send")
    run_dir_arg(p)
    p.set_defaults(func=_cmd_infer)

    p = sub.add_parser(
        "loadtest",
        help="a bounded load run against a served model, every answer checked against eager",
        description="Send --requests requests at --concurrency over loopback to a served model, "
        "check every answer against the eager model, and report failures, p50/p99 latency, "
        "throughput, worker memory before and after, and (with --kill-worker-after) how long "
        "TorchServe took to replace a SIGKILLed worker. Exits 1 if any request failed or was wrong.",
    )
    p.add_argument(
        "--model",
        required=True,
        help="an exported model (zoo name or user spec, e.g. torchvision:resnet18)",
    )
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--format", choices=list(FORMATS), default="torchscript", help="default: torchscript"
    )
    p.add_argument("--requests", type=int, default=20_000, help="default: 20000")
    p.add_argument("--concurrency", type=int, default=32, help="default: 32")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds (default: 600)")
    p.add_argument(
        "--kill-worker-after",
        type=int,
        help="SIGKILL the model's worker once this many requests were answered",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="archive the export into a private store and start a private server on free "
        "loopback ports for this run (stopped afterwards); default: use the running server",
    )
    p.add_argument("--json", type=Path, help="also write the report as JSON")
    run_dir_arg(p)
    p.set_defaults(func=_cmd_loadtest)


def _cmd_loadtest(args: argparse.Namespace) -> int:
    import tempfile

    from pipeline.archive import ArchiveConfig, archive, archive_name
    from pipeline.loadtest import LoadConfig, run, to_markdown, write_reports
    from pipeline.serve import ServeConfig, free_port, start, stop

    export_dir = args.export_dir or paths.export_dir(args.model, args.artifacts_dir)
    name = archive_name(args.model, args.format)
    with tempfile.TemporaryDirectory(prefix="loadtest-") as tmp:
        run_dir = serve_run_dir(args)
        if args.serve:
            store, run_dir = Path(tmp) / "store", Path(tmp) / "run"
            archive(ArchiveConfig(model=args.model, export_dir=export_dir, store=store,
                                  formats=(args.format,)))  # fmt: skip
            print(f"starting a private TorchServe for {name} ...", flush=True)
            start(ServeConfig(store=store, run_dir=run_dir, inference_port=free_port(),
                              management_port=free_port(), metrics_port=free_port()))  # fmt: skip
        try:
            print(
                f"{args.requests} requests to {name} at concurrency {args.concurrency} ...",
                flush=True,
            )
            report = run(
                LoadConfig(
                    export_dir=export_dir, archive=name, run_dir=run_dir, requests=args.requests,
                    concurrency=args.concurrency, time_limit_s=args.time_limit,
                    kill_worker_after=args.kill_worker_after,
                )
            )  # fmt: skip
        finally:
            if args.serve:
                stop(run_dir)
    print(report.summary())
    print(to_markdown([report]))
    if args.json:
        write_reports([report], args.json)
    return 0 if report.passed else 1


def _cmd_archive(args: argparse.Namespace) -> int:
    from pipeline.archive import ArchiveConfig, archive

    config = ArchiveConfig(
        model=args.model,
        export_dir=args.export_dir or paths.export_dir(args.model, args.artifacts_dir),
        store=args.store,
        formats=tuple(args.format) if args.format else None,
        batch_size=args.batch_size,
        max_batch_delay_ms=args.max_batch_delay_ms,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        response_timeout_s=args.response_timeout,
        startup_timeout_s=args.startup_timeout,
        device=args.device,
    )
    for path in archive(config):
        print(f"wrote {path}")
    return 0


def serve_run_dir(args: argparse.Namespace) -> Path:
    return args.run_dir or paths.artifacts_root(args.artifacts_dir) / "serve"


def _cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.serve import ServeConfig, start

    server = start(
        ServeConfig(
            store=args.store,
            run_dir=serve_run_dir(args),
            models=args.models,
            host=args.host,
            inference_port=args.port,
            management_port=args.management_port,
            metrics_port=args.metrics_port,
            threads_per_worker=args.threads_per_worker,
            workers_per_model=args.workers_per_model,
            max_request_size=args.max_request_size,
            gpu=args.gpu,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            keep_going=args.keep_going,
            fastest_only=not args.all_formats and not args.models,
        )
    )
    if server.failed:
        print(f"NOT serving (failed to load, see the log): {', '.join(server.failed)}")
    print(f"TorchServe is up (pid {server.pid}), serving: {', '.join(server.models)}")
    print(
        f"  inference:  {server.inference_url}/predictions/<model> (gateway pid {server.gateway_pid})"
    )
    print(f"  management: {server.management_url} (register/delete disabled)")
    print(f"  metrics:    {server.metrics_url}/metrics")
    print(
        f"  tokens:     {Path(server.run_dir) / 'key_file.json'} (send 'Authorization: Bearer <inference key>')"
    )
    print(f"  logs:       {Path(server.run_dir) / 'logs'}")
    print("stop it with `pipeline stop` (or `make stop`)")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from pipeline.serve import stop

    print("stopped TorchServe" if stop(serve_run_dir(args)) else "no TorchServe was running")
    return 0


def _cmd_infer(args: argparse.Namespace) -> int:
    from pipeline.client import infer

    print(json.dumps(infer(args.model, args.input, serve_run_dir(args)), indent=2))
    return 0
