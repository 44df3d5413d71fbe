"""The `pipeline` command: parses arguments and calls one stage function.

No stage logic lives here; see pipeline/<stage>.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.cli.args import input_specs, kwargs_arg, model_arg
from pipeline.cli.deploy import add_serving_commands
from pipeline.cli.measure import add_bench_command, add_cpp_commands
from pipeline.cli.train import add_train_command
from pipeline.cli.verify import add_verify_command
from pipeline.core import paths
from pipeline.core.errors import PipelineError

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


def _cmd_where(args: argparse.Namespace) -> int:
    where = {
        "dir": paths.model_dir,
        "checkpoint": paths.checkpoint_path,
        "export": paths.export_dir,
        "report": paths.report_path,
    }[args.what]
    print(where(args.model, args.artifacts_dir))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from pipeline.export import ExportConfig, export

    inputs, outputs = input_specs(args)
    config = ExportConfig.from_args(args, inputs=inputs, outputs=outputs)
    if args.if_missing and _export_holds(config):
        print(f"{config.out_dir} already holds {', '.join(config.formats)}; nothing to do")
        return 0
    result = export(config)
    print(f"exported {args.model} to {result.out_dir}")
    for art in result.manifest.artifacts.values():
        reason = f": {art.reason}" if art.reason else ""
        print(f"  {art.file:22s} {art.how}{reason}")
    return 0


def _export_holds(config: Any) -> bool:
    """Whether the export folder already holds every asked-for format (for --if-missing)."""
    from pipeline.core.errors import ArtifactError
    from pipeline.core.manifest import read_manifest

    try:
        manifest = read_manifest(config.out_dir)
    except ArtifactError:
        return False
    return manifest.model.name == config.model and all(
        f in manifest.artifacts for f in config.formats
    )


def build_parser() -> argparse.ArgumentParser:
    from pipeline.core.compare import DEFAULT_ATOL, DEFAULT_RTOL
    from pipeline.export import DEFAULT_FORMATS
    from pipeline.export import FORMATS as EXPORT_FORMATS
    from pipeline.formats.onnx import DEFAULT_OPSET
    from pipeline.formats.torchscript import METHODS

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
        "where",
        help="print where a model's checkpoint or export lives (for scripts and the Makefile)",
        description="Print the path the stages use for MODEL, e.g. "
        "`pipeline where --model torchvision:resnet18 --what export` → artifacts/torchvision_resnet18/export.",
    )
    model_arg(p)
    p.add_argument(
        "--what",
        choices=("dir", "checkpoint", "export", "report"),
        default="dir",
        help="which path (default: the model's folder)",
    )
    p.set_defaults(func=_cmd_where)

    add_train_command(sub)

    p = sub.add_parser(
        "export",
        help="export a checkpoint to TorchScript, ONNX and/or .pt2 (AOTInductor)",
        description="Load a checkpoint (sha256-checked), put the model in eval mode, "
        "write TorchScript, ONNX (dynamic batch) and, with --format pt2, an AOTInductor "
        "package, plus golden I/O and manifest.json.",
    )
    model_arg(p)
    p.add_argument("--checkpoint", type=Path, help="default: <artifacts>/<model>/checkpoint.pt")
    p.add_argument("--out-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--format",
        action="append",
        choices=(*EXPORT_FORMATS, "all"),
        help=f"what to write; repeat for several (default: {' and '.join(DEFAULT_FORMATS)}). "
        "pt2 is torch.export + AOTInductor, compiled for --pt2-device (tens of seconds per model)",
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
        "--if-missing",
        action="store_true",
        help="do nothing when the export folder already holds every asked-for format",
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
    kwargs_arg(g)
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

    add_verify_command(sub)
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
