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
from pipeline.cli_deploy import (
    add_bench_command,
    add_cpp_commands,
    add_serving_commands,
    run_dir_arg,
    serve_run_dir,
)
from pipeline.errors import ParityError, PipelineError

log = logging.getLogger("pipeline")

_EPILOG = """\
stages run left to right, each reading what the one before wrote:
  pipeline train   → artifacts/<model>/checkpoint.pt (+ .json sidecar)
  pipeline export  → artifacts/<model>/export/ (TorchScript, ONNX, golden I/O, manifest.json)
  pipeline verify  → artifacts/<model>/parity.json, and a table; exit 1 on any mismatch
  pipeline archive → model_store/<model>_ts.mar, <model>_onnx.mar; then serve / infer / stop
  pipeline build-cpp → cpp_client/build/run_torchscript; verify --backend cpp uses it

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


def _export_formats(chosen: list[str] | None) -> tuple[str, ...]:
    from pipeline.export import DEFAULT_FORMATS, FORMATS

    if not chosen:
        return DEFAULT_FORMATS
    if "all" in chosen:
        return FORMATS
    return tuple(dict.fromkeys(chosen))  # in the order given, once each


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
        formats=_export_formats(args.format),
        pt2_device=args.pt2_device,
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
        run_dir=serve_run_dir(args),
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
    from pipeline.export import FORMATS as EXPORT_FORMATS
    from pipeline.export.onnx_export import DEFAULT_OPSET
    from pipeline.export.torchscript import METHODS
    from pipeline.verify.backends import BACKENDS

    parser = argparse.ArgumentParser(
        prog="pipeline",
        description="Train a PyTorch model, export it to TorchScript and ONNX, serve it with "
        "TorchServe, run it from C++, and prove every backend computes what eager PyTorch computes.",
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
        help="export a checkpoint to TorchScript, ONNX and/or .pt2 (AOTInductor)",
        description="Load a checkpoint (sha256-checked), put the model in eval mode, "
        "write TorchScript, ONNX (dynamic batch) and, with --format pt2, an AOTInductor "
        "package, plus golden I/O and manifest.json.",
    )
    _model_arg(p)
    p.add_argument("--checkpoint", type=Path, help="default: <artifacts>/<model>/checkpoint.pt")
    p.add_argument("--out-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--format",
        action="append",
        choices=(*EXPORT_FORMATS, "all"),
        help="what to write; repeat for several (default: torchscript and onnx). pt2 is "
        "torch.export + AOTInductor, compiled for --pt2-device (tens of seconds per model)",
    )
    p.add_argument(
        "--pt2-device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device the .pt2 package is compiled for (default: cpu; cuda needs a GPU here)",
    )
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
    run_dir_arg(p)
    p.set_defaults(func=_cmd_verify)

    add_serving_commands(sub)
    add_cpp_commands(sub)
    add_bench_command(sub)
    return parser


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
