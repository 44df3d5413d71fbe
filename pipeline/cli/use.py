"""The `pipeline` subcommands that use a running server: infer and loadtest.

Like the rest of the CLI, this only parses arguments and calls a stage function.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from pipeline.cli.args import (
    run_dir_arg,
    running_store,
    serve_run_dir,
    store_arg,
    terminated_as_exit,
)
from pipeline.core import paths
from pipeline.core.errors import PipelineError


def add_client_commands(sub: argparse._SubParsersAction, formats: list[str]) -> None:
    p = sub.add_parser(
        "infer",
        help="send an image or tensors to a served model and print the answer",
        description="Send a file to a served model with the inference token and print the "
        "answer: a .png/.jpg image, a .json body, a .npy/.npz array file or a torch.save'd .pt "
        "of tensors. TorchServe gets it at /predictions/<model>; the KServe and Ray Serve "
        "runtimes get it as an Open Inference Protocol request (/v2/models/<model>/infer, "
        "under the run's route prefix on a joined Ray cluster; tensors only, no images).",
    )
    p.add_argument(
        "--model",
        required=True,
        help="a served name (digits_lenet_ts) or a model as exported (digits_lenet, "
        "torchvision:resnet18): the format it is served in, TorchScript when several",
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
        "the runtime took to replace a SIGKILLed worker. Exits 1 if any request failed, was "
        "wrong or got a 5xx, or if --time-limit ended the run before every request was sent "
        "(the verdict line says which).",
    )
    p.add_argument(
        "--model",
        required=True,
        help="an exported model (zoo name or user spec, e.g. torchvision:resnet18)",
    )
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--format",
        choices=formats,
        help="default: the format the server serves the model in (with --serve: the one "
        "`pipeline serve` would serve: bench's fastest, else the first held in registry "
        "order, TorchScript first unless this torch refuses torch.jit)",
    )
    p.add_argument("--requests", type=int, default=20_000, help="default: 20000")
    p.add_argument("--concurrency", type=int, default=32, help="default: 32")
    p.add_argument(
        "--time-limit",
        type=float,
        default=600.0,
        help="seconds (default: 600); a run it ends before every request was sent fails",
    )
    p.add_argument(
        "--kill-worker-after",
        type=int,
        help="SIGKILL the model's worker once this many requests were answered",
    )
    p.add_argument(
        "--kill-node-after",
        type=int,
        help="kill a worker node that serves the model (every process of it, as a lost "
        "machine) once this many requests were answered, and report what clients saw and "
        "how long until the surviving nodes answered (a runtime on a cluster: ray)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="serve the export from a private server of the runtime, on free "
        "loopback ports for this run (stopped afterwards); default: use the running server",
    )
    from pipeline.serving import runtime

    p.add_argument(
        "--runtime",
        choices=runtime.names(),
        default=runtime.default(),
        help=f"with --serve: the private server's runtime (default: {runtime.default()}); "
        "without, the running server's runtime is used",
    )
    p.add_argument(
        "--encodings",
        default="json",
        metavar="LIST",
        help="how bodies are sent, in turn, comma-separated: json, npy, json-untyped, "
        "npy-untyped (no Content-Type), json-form, npy-form (curl's default form type); "
        "default: json",
    )
    p.add_argument(
        "--by-version",
        action="store_true",
        help="check each answer against eager of the version it names (its model_version), "
        "every published version in --store: a load run across `pipeline rollout`",
    )
    store_arg(p, running=True)
    p.add_argument("--json", type=Path, help="also write the report as JSON")
    run_dir_arg(p)
    p.set_defaults(func=_cmd_loadtest)


def _cmd_loadtest(args: argparse.Namespace) -> int:
    from pipeline.serving.loadreport import to_markdown, write_reports
    from pipeline.serving.loadtest import LoadConfig, run_served

    export_dir = args.export_dir or paths.export_dir(args.model, args.artifacts_dir)
    # The running server's store (as rollout's): model_store's versions judged the answers
    # of a server started with --store, and every answer "failed" (a user's trial).
    store = running_store(args) if not args.serve else args.store or paths.DEFAULT_STORE
    if args.by_version and not Path(store).is_dir():
        raise PipelineError(
            f"--by-version: there is no store at {store} (give the server's --store)."
        )
    if args.by_version and args.export_dir is None:
        from pipeline.serving import versions

        published = versions.default(args.model, store)
        export_dir = published.dir if published else export_dir
    config = LoadConfig(
        export_dir=export_dir,
        run_dir=serve_run_dir(args),
        format=args.format,
        requests=args.requests,
        concurrency=args.concurrency,
        time_limit_s=args.time_limit,
        kill_worker_after=args.kill_worker_after,
        kill_node_after=args.kill_node_after,
        encodings=tuple(e.strip() for e in args.encodings.split(",") if e.strip()),
        runtime=args.runtime,
        store=store if args.by_version else None,
    )
    say = functools.partial(print, flush=True)
    with terminated_as_exit():  # a --serve's private server stopped on a SIGTERM too
        report = run_served(config, private=args.serve, say=say)
    print(report.summary())
    print(to_markdown([report]))
    if args.json:
        write_reports([report], args.json)
    return 0 if report.passed else 1


def _cmd_infer(args: argparse.Namespace) -> int:
    from pipeline.serving.client import infer, resolve_model
    from pipeline.serving.served import served_freshness
    from pipeline.serving.server import Server

    run_dir = serve_run_dir(args)
    server = Server.load(run_dir)
    name = resolve_model(server, args.model)
    # An answer from another export than the one on disk looks like a wrong model.
    fresh, why = served_freshness(server, name, args.artifacts_dir)
    if fresh is False:
        print(f"warning: {why}", file=sys.stderr)
    elif args.verbose and why:
        print(why, file=sys.stderr)
    print(json.dumps(infer(name, args.input, run_dir), indent=2))
    return 0
