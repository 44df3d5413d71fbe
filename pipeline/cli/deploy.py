"""The `pipeline` subcommands that deploy an export: archive, serve, stop, infer, loadtest.

Like the rest of the CLI, this only parses arguments and calls a stage function.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from pipeline.cli.args import model_arg, run_dir_arg, serve_run_dir
from pipeline.cli.use import add_client_commands
from pipeline.core import paths


def add_serving_commands(sub: argparse._SubParsersAction) -> None:
    from pipeline.core.paths import DEFAULT_STORE
    from pipeline.formats import base as registry

    formats = list(registry.keys())
    p = sub.add_parser(
        "archive",
        help="package an export as TorchServe .mar files in model_store/",
        description="Write one model_store/<model>_<format>.mar per format the export holds "
        "(artifact, handler and its runtime, manifest, golden inputs for warm-up, "
        "model-config.yaml, and archive.json naming the model, the format and the fastest "
        "backend `pipeline bench` measured).",
    )
    model_arg(p)
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="default: model_store")
    p.add_argument(
        "--format",
        action="append",
        choices=formats,
        help="default: every format the export holds",
    )
    p.add_argument(
        "--bench-results",
        type=Path,
        help="the fastest.json `pipeline bench` wrote (default: <artifacts>/bench/fastest.json "
        "when it exists); `pipeline serve` then serves each model's fastest format only",
    )
    p.add_argument("--batch-size", type=int, default=8, help="TorchServe batch size (default: 8)")
    p.add_argument(
        "--max-batch-delay-ms",
        type=int,
        default=1,
        help="how long TorchServe waits for a batch to fill; a lone request waits all of it "
        "(default: 1, its smallest; 0 means TorchServe's 100 ms)",
    )
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
        "return once every model is READY (or fail with the worker's log). Clients get the "
        "inference key alone in <run dir>/inference_key.json; the management key stays in the "
        "owner-only key_file.json.",
    )
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="default: model_store")
    p.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        help="what to serve: archive names (digits_lenet_onnx) or models (digits_lenet: its one "
        "format, as by default); default: one format of every model in the store",
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
        help="serve every archived format of every model (default: one per model, the fastest "
        "verified backend `pipeline bench` measured, else TorchScript; each format costs "
        "workers and memory)",
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
        help="intra-op threads per worker (default: physical cores / all workers, at least 1; "
        "kserve: physical cores)",
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
    kserve = p.add_argument_group(
        "--runtime kserve",
        "KServe's model server over the Open Inference Protocol (REST /v2 and gRPC), one "
        "model per export, the same token, body limit and loopback default",
    )
    kserve.add_argument(
        "--runtime",
        choices=["torchserve", "kserve"],
        default="torchserve",
        help="torchserve (default: the .mar archives in --store) or kserve (exports directly)",
    )
    kserve.add_argument(
        "--model",
        action="append",
        dest="export_models",
        metavar="MODEL",
        help="kserve: serve <artifacts>/<MODEL>/export (repeatable)",
    )
    kserve.add_argument(
        "--export-dir",
        action="append",
        type=Path,
        metavar="DIR",
        help="kserve: serve this export folder (repeatable; default: the default model's)",
    )
    kserve.add_argument(
        "--format",
        choices=formats,
        help="kserve: the artifact to serve from each export (default: the first it holds, "
        "in registry order)",
    )
    kserve.add_argument(
        "--grpc-port", type=int, default=8081, help="kserve gRPC port (default: 8081)"
    )
    kserve.add_argument(
        "--max-batch-size",
        type=int,
        default=8,
        help="kserve: queued requests stacked into one forward pass at most (default: 8)",
    )
    kserve.add_argument(
        "--max-batch-delay-ms",
        type=float,
        default=0.0,
        help="kserve: how long a batch waits for more requests (default: 0, only what is queued)",
    )
    run_dir_arg(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("stop", help="stop the TorchServe started by `pipeline serve`")
    run_dir_arg(p)
    p.set_defaults(func=_cmd_stop)

    add_client_commands(sub, formats)


def _cmd_archive(args: argparse.Namespace) -> int:
    from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
    from pipeline.serving.provenance import default_bench_results

    config = ArchiveConfig(
        model=args.model,
        export_dir=args.export_dir or paths.export_dir(args.model, args.artifacts_dir),
        store=args.store,
        formats=tuple(args.format) if args.format else None,
        bench_results=args.bench_results or default_bench_results(args.artifacts_dir),
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


def _cmd_serve_kserve(args: argparse.Namespace) -> int:
    from pipeline.runtimes.kserve.config import RuntimeConfig, default_threads
    from pipeline.runtimes.kserve.launch import served_export, start
    from pipeline.serving.server import INFERENCE_KEY_FILE
    from pipeline.zoo import DEFAULT_MODEL

    dirs = list(args.export_dir or [])
    dirs += [paths.export_dir(m, args.artifacts_dir) for m in args.export_models or []]
    dirs = dirs or [paths.export_dir(DEFAULT_MODEL, args.artifacts_dir)]
    config = RuntimeConfig(
        models=[served_export(d, args.format) for d in dirs],
        host=args.host,
        http_port=args.port,
        grpc_port=args.grpc_port,
        max_request_size=args.max_request_size,
        tls_cert=str(args.tls_cert) if args.tls_cert else None,
        tls_key=str(args.tls_key) if args.tls_key else None,
        max_batch_size=args.max_batch_size,
        max_batch_delay_ms=args.max_batch_delay_ms,
        threads=args.threads_per_worker or default_threads(),
    )
    server = start(config, serve_run_dir(args))
    print(f"KServe is up (pid {server.pid}), serving: {', '.join(server.models)}")
    print(f"  REST:    {server.inference_url}/v2/models/<model>/infer")
    print(f"  gRPC:    {server.grpc_url} (inference.GRPCInferenceService)")
    print(f"  metrics: {server.metrics_url}/metrics")
    print(
        f"  token:   {Path(server.run_dir) / INFERENCE_KEY_FILE} (send "
        "'Authorization: Bearer <its inference key>', also as gRPC metadata)"
    )
    print(f"  logs:    {Path(server.run_dir) / 'logs'}")
    print("stop it with `pipeline stop`")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.runtime == "kserve":
        return _cmd_serve_kserve(args)
    if args.export_dir or args.format:
        from pipeline.core.errors import PipelineError

        raise PipelineError(
            "--export-dir and --format are for --runtime kserve; TorchServe serves --store."
        )
    if args.export_models:  # before --model existed, argparse read it as --models
        args.models = [*(args.models or []), *args.export_models]
    from pipeline.runtimes.torchserve.launch import ServeConfig, start
    from pipeline.runtimes.torchserve.workers import footprint
    from pipeline.serving.server import INFERENCE_KEY_FILE, KEY_FILE

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
            one_format=not args.all_formats,
        )
    )
    if server.failed:
        print(f"NOT serving (failed to load, see the log): {', '.join(server.failed)}")
    print(f"TorchServe is up (pid {server.pid}), serving: {', '.join(server.models)}")
    workers, worker_mb, total_mb = footprint(server)
    print(
        f"  workers:    {workers} for {len(server.models) - len(server.failed)} model(s), "
        f"{worker_mb:,.0f} MiB; {total_mb:,.0f} MiB with TorchServe's frontend and the gateway"
    )
    print(
        f"  inference:  {server.inference_url}/predictions/<model> (gateway pid {server.gateway_pid})"
    )
    # Paths only, never a key: this output ends up in terminals, CI logs and tickets.
    run_dir = Path(server.run_dir)
    print(
        f"  management: {server.management_url} (register/delete disabled; scaling needs the "
        "management key, kept for `pipeline serve` only)"
    )
    print(f"  metrics:    {server.metrics_url}/metrics")
    print(
        f"  token:      {run_dir / INFERENCE_KEY_FILE} (for clients: send "
        "'Authorization: Bearer <its inference key>')"
    )
    print(
        f"  private:    {run_dir / KEY_FILE} (mode 0600: management and API keys, share it with no one)"
    )
    print(f"  logs:       {Path(server.run_dir) / 'logs'}")
    print("stop it with `pipeline stop` (or `make stop`)")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from pipeline.runtimes.torchserve.launch import stop
    from pipeline.serving.server import SERVER_FILE, Server

    run_dir = serve_run_dir(args)
    kind = "TorchServe"
    if (run_dir / SERVER_FILE).is_file():
        with contextlib.suppress(OSError, ValueError, TypeError):
            kind = "the KServe runtime" if Server.load(run_dir).runtime == "kserve" else kind
    print(f"stopped {kind}" if stop(run_dir) else f"no {kind} was running")
    return 0
