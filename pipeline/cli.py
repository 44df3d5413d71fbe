"""The `pipeline` command: parses arguments and calls one stage function.

No stage logic lives here; see pipeline/<stage>.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline import __version__, paths
from pipeline.errors import ParityError, PipelineError

log = logging.getLogger("pipeline")

_EPILOG = """\
stages run left to right, each reading what the one before wrote:
  pipeline train   → artifacts/<model>/checkpoint.pt (+ .json sidecar)
  pipeline export  → artifacts/<model>/export/ (TorchScript, ONNX, golden I/O, manifest.json)
  pipeline verify  → artifacts/<model>/parity.json, and a table; exit 1 on any mismatch

example:  pipeline train && pipeline export && pipeline verify
"""


def _model_arg(p: argparse.ArgumentParser) -> None:
    from pipeline.zoo import DEFAULT_MODEL

    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"a zoo model (default: {DEFAULT_MODEL}; see `pipeline models`), "
        "package.module:ClassName, path/to/file.py:ClassName or torchvision:NAME",
    )


def _kwargs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-kwargs",
        metavar="JSON",
        help="constructor keyword arguments as a JSON object, e.g. '{\"num_classes\": 10}'",
    )


def _input_specs(args: argparse.Namespace) -> tuple[list | None, list[str] | None]:
    from pipeline.zoo.user import load_spec_file, parse_input

    inputs = [parse_input(text) for text in args.input or []]
    outputs = list(args.output or [])
    if args.input_spec:
        if inputs:
            raise PipelineError("Give inputs either with --input or with --input-spec, not both.")
        inputs, file_outputs = load_spec_file(args.input_spec)
        outputs = outputs or file_outputs
    return inputs or None, outputs or None


def _cmd_models(args: argparse.Namespace) -> int:
    from pipeline.zoo import get_entry, zoo_names

    for name in zoo_names():
        entry = get_entry(name)
        ins = ", ".join(
            f"{s.name}{s.describe_shape()}:{str(s.dtype).removeprefix('torch.')}"
            for s in entry.inputs
        )
        print(
            f"{name:16s} {entry.description}\n{'':16s} inputs: {ins}; outputs: {', '.join(entry.outputs)}"
        )
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from pipeline.train import TrainConfig, train
    from pipeline.zoo.user import parse_kwargs

    config = TrainConfig(
        model=args.model,
        out=args.out or paths.checkpoint_path(args.model, args.artifacts_dir),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        workers=args.workers,
        device=args.device,
        progress=not args.no_progress,
        model_kwargs=parse_kwargs(args.model_kwargs),
        amp=args.amp,
        clip_grad_norm=args.clip_grad_norm,
        resume=args.resume,
        stop_after_epoch=args.stop_after_epoch,
        report=not args.no_report,
    )
    result = train(config)
    meta = result.checkpoint.meta
    if not meta:  # a non-zero rank under torchrun: rank 0 reports
        return 0
    print(f"checkpoint: {result.checkpoint.path}")
    print(f"sha256:     {meta['weights_sha256']}")
    metrics = {k: v for k, v in meta["metrics"].items() if k != "history"}
    print(f"metrics:    {json.dumps(metrics)}  ({result.seconds:.1f} s)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from pipeline.export import ExportConfig, export
    from pipeline.zoo.user import parse_kwargs

    inputs, outputs = _input_specs(args)
    config = ExportConfig(
        model=args.model,
        model_kwargs=parse_kwargs(args.model_kwargs),
        inputs=inputs,
        outputs=outputs,
        probes_file=args.probes,
        weights=args.weights,
        random_init=args.random_init,
        seed=args.seed,
        checkpoint=args.checkpoint or paths.checkpoint_path(args.model, args.artifacts_dir),
        out_dir=args.out_dir or paths.export_dir(args.model, args.artifacts_dir),
        method=args.method,
        allow_unsafe_trace=args.allow_unsafe_trace,
        opset=args.opset,
        atol=args.atol,
        rtol=args.rtol,
    )
    result = export(config)
    print(f"exported {args.model} to {result.out_dir}")
    for art in result.manifest["artifacts"].values():
        how = art.get("method") or art.get("exporter") or art.get("format")
        reason = f": {art['reason']}" if art.get("reason") else ""
        print(f"  {art['file']:22s} {how}{reason}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from pipeline.verify import VerifyConfig, verify

    config = VerifyConfig(
        model=args.model,
        export_dir=args.export_dir or paths.export_dir(args.model, args.artifacts_dir),
        checkpoint=args.checkpoint,
        backends=tuple(args.backend) if args.backend else None,
        run_dir=_serve_run_dir(args),
        atol=args.atol,
        rtol=args.rtol,
        batch_sizes=tuple(args.batch_sizes),
        seed=args.seed,
        report=args.report or paths.report_path(args.model, args.artifacts_dir),
    )
    report = verify(config)
    report.print_table()
    if not report.passed:
        raise ParityError(report.failure_message())
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pipeline.compare import DEFAULT_ATOL, DEFAULT_RTOL
    from pipeline.export.onnx_export import DEFAULT_OPSET
    from pipeline.export.torchscript import METHODS
    from pipeline.verify.backends import BACKENDS

    parser = argparse.ArgumentParser(
        prog="pipeline",
        description="Train a PyTorch model, export it to TorchScript and ONNX, and prove every "
        "backend computes what eager PyTorch computes.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--artifacts-dir",
        type=Path,
        default=None,
        help="root of all outputs (default: $PIPELINE_ARTIFACTS or ./artifacts)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="command", metavar="STAGE", required=True)

    p = sub.add_parser("models", help="list the built-in models")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser(
        "train",
        help="train a zoo model and write a checkpoint",
        description="Seeded, deterministic training; writes <model>/checkpoint.pt, its .json "
        "sidecar, a resumable .state.pt, a .summary.txt and a .png plot, atomically, after every "
        "epoch. Several processes: torchrun --nproc-per-node N -m pipeline train ... "
        "(DistributedDataParallel; --batch-size is the global batch).",
    )
    _model_arg(p)
    p.add_argument(
        "--out", type=Path, help="checkpoint path (default: <artifacts>/<model>/checkpoint.pt)"
    )
    p.add_argument("--epochs", type=int, help="epochs (default: the model's, else 12)")
    p.add_argument("--batch-size", type=int, help="batch size (default: the model's, else 64)")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the model's, else 3e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed for every RNG (default: 0)")
    p.add_argument(
        "--workers", type=int, default=0, help="DataLoader worker processes (default: 0)"
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--amp",
        action="store_true",
        help="mixed precision: fp16 autocast + GradScaler on CUDA, bf16 autocast on CPU "
        "(the checkpoint stays float32)",
    )
    p.add_argument(
        "--clip-grad-norm",
        type=float,
        metavar="MAX",
        help="clip the gradient norm (after unscaling)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from <checkpoint>.state.pt (model, optimizer, scheduler, scaler, RNG, epoch)",
    )
    p.add_argument(
        "--stop-after-epoch",
        type=int,
        metavar="N",
        help="stop cleanly after epoch N, as an interrupted run would (continue with --resume)",
    )
    p.add_argument(
        "--no-report", action="store_true", help="skip the model summary and the PNG plot"
    )
    _kwargs_arg(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "export",
        help="export a checkpoint to TorchScript and ONNX",
        description="Load a checkpoint (sha256-checked), put the model in eval mode, "
        "write TorchScript, ONNX (dynamic batch), golden I/O and manifest.json.",
    )
    _model_arg(p)
    p.add_argument("--checkpoint", type=Path, help="default: <artifacts>/<model>/checkpoint.pt")
    p.add_argument("--out-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--method",
        choices=METHODS,
        default="auto",
        help="TorchScript method: auto traces strictly and scripts when the trace "
        "is unfaithful (default: auto)",
    )
    p.add_argument(
        "--allow-unsafe-trace",
        action="store_true",
        help="with --method trace, keep a trace even when it was rejected",
    )
    p.add_argument(
        "--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default: {DEFAULT_OPSET})"
    )
    p.add_argument(
        "--atol",
        type=float,
        default=DEFAULT_ATOL,
        help=f"tolerance recorded for verify (default: {DEFAULT_ATOL:g})",
    )
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"(default: {DEFAULT_RTOL:g})")
    g = p.add_argument_group(
        "models outside the zoo (module:Class, file.py:Class, torchvision:NAME)"
    )
    _kwargs_arg(g)
    g.add_argument(
        "--input",
        action="append",
        metavar="NAME:DTYPE:SHAPE",
        help="an input, in forward() order; repeat for several. A name in SHAPE is a dynamic "
        "axis: --input image:float32:batch,3,32,32",
    )
    g.add_argument(
        "--input-spec", type=Path, metavar="FILE", help="inputs (and outputs) from YAML or TOML"
    )
    g.add_argument("--output", action="append", metavar="NAME", help="output names, in order")
    g.add_argument(
        "--probes",
        type=Path,
        metavar="FILE",
        help="probe inputs chosen to drive every branch: torch.save'd list of {name: tensor} "
        "dicts, or {label: {name: tensor}}",
    )
    w = g.add_mutually_exclusive_group()
    w.add_argument(
        "--weights",
        type=Path,
        metavar="FILE",
        help="a state_dict saved with torch.save; imported (weights_only) as the checkpoint",
    )
    w.add_argument(
        "--random-init", action="store_true", help="export with seeded random weights (see --seed)"
    )
    g.add_argument("--seed", type=int, default=0, help="seed for --random-init (default: 0)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "verify",
        help="compare every backend with eager PyTorch",
        description="Run eager, TorchScript and ONNX Runtime on the golden inputs, "
        "the model's probe inputs and fresh random batches; print a table, write a "
        "JSON report, exit 1 listing every check out of tolerance.",
    )
    _model_arg(p)
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--checkpoint", type=Path, help="eager reference (default: the one in the manifest)"
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        default=None,
        help="backend to check; repeat for several (default: torchscript and onnxruntime, "
        "plus torchserve when a server started by `pipeline serve` serves the model)",
    )
    p.add_argument("--atol", type=float, help="absolute tolerance (default: the manifest's)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: the manifest's)")
    p.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[1, 7],
        help="fresh random batches (default: 1 7)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the fresh random inputs (default: 0)"
    )
    p.add_argument(
        "--report", type=Path, help="JSON report path (default: <artifacts>/<model>/parity.json)"
    )
    _run_dir_arg(p)
    p.set_defaults(func=_cmd_verify)

    _add_serving_commands(sub)

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
        help="time the C++ client against Python TorchScript at batch 1, in one run",
        description="Interleaved rounds of the LibTorch client and Python TorchScript on the golden "
        "input's first sample; prints p50/p90 and the C++/Python ratio (builds the client if needed).",
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
    return parser


def _cmd_latency(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pipeline.cpp import compare_latency
    from pipeline.manifest import artifact_path, read_manifest

    table = Table(title="TorchScript latency at batch 1: LibTorch C++ vs Python (same run)")
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
            artifact_path(export_dir, manifest, "torchscript"), inputs, threads=args.threads,
            warmup=args.warmup, repeat=args.repeat, rounds=args.rounds,
        )  # fmt: skip
        result["model"] = model
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


def _run_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-dir",
        type=Path,
        help="where `pipeline serve` keeps its config, logs, token file and pid (default: <artifacts>/serve)",
    )


def _add_serving_commands(sub: argparse._SubParsersAction) -> None:
    from pipeline.archive import DEFAULT_STORE, FORMATS

    p = sub.add_parser(
        "archive",
        help="package an export as TorchServe .mar files in model_store/",
        description="Write model_store/<model>_ts.mar and <model>_onnx.mar (artifact, handler, manifest, "
        "golden inputs for warm-up, model-config.yaml).",
    )
    _model_arg(p)
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="default: model_store")
    p.add_argument("--format", action="append", choices=list(FORMATS), help="default: all formats")
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
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="inference port (default: 8080)")
    p.add_argument("--management-port", type=int, default=8081, help="default: 8081")
    p.add_argument("--metrics-port", type=int, default=8082, help="default: 8082")
    p.add_argument("--threads-per-worker", type=int, default=1, help="default: 1")
    p.add_argument(
        "--max-request-size", type=int, default=4 * 1024 * 1024, help="bytes (default: 4 MiB)"
    )
    p.add_argument("--gpu", action="store_true", help="give workers a GPU when CUDA is present")
    _run_dir_arg(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("stop", help="stop the TorchServe started by `pipeline serve`")
    _run_dir_arg(p)
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
    _run_dir_arg(p)
    p.set_defaults(func=_cmd_infer)


def _cmd_archive(args: argparse.Namespace) -> int:
    from pipeline.archive import ArchiveConfig, archive

    config = ArchiveConfig(
        model=args.model,
        export_dir=args.export_dir or paths.export_dir(args.model, args.artifacts_dir),
        store=args.store,
        formats=tuple(args.format) if args.format else ("torchscript", "onnx"),
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


def _serve_run_dir(args: argparse.Namespace) -> Path:
    return args.run_dir or paths.artifacts_root(args.artifacts_dir) / "serve"


def _cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.serve import ServeConfig, start

    server = start(
        ServeConfig(
            store=args.store,
            run_dir=_serve_run_dir(args),
            models=args.models,
            host=args.host,
            inference_port=args.port,
            management_port=args.management_port,
            metrics_port=args.metrics_port,
            threads_per_worker=args.threads_per_worker,
            max_request_size=args.max_request_size,
            gpu=args.gpu,
        )
    )
    print(f"TorchServe is up (pid {server.pid}), serving: {', '.join(server.models)}")
    print(f"  inference:  {server.inference_url}/predictions/<model>")
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

    print("stopped TorchServe" if stop(_serve_run_dir(args)) else "no TorchServe was running")
    return 0


def _cmd_infer(args: argparse.Namespace) -> int:
    from pipeline.client import infer

    print(json.dumps(infer(args.model, args.input, _serve_run_dir(args)), indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Our own progress at INFO; third-party chatter (the ONNX exporter's
    # optimiser passes log at INFO) only with --verbose.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return int(args.func(args))
    except PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pipeline ... | head`: the reader left; not an error
        sys.stderr.close()
        return 0
