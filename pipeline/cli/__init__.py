"""The `pipeline` command: parses arguments and calls one stage function.

No stage logic lives here; see pipeline/<stage>.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline import __version__
from pipeline.cli.args import add_budget_args, input_specs, kwargs_arg, model_arg
from pipeline.cli.deploy import add_deploy_command, add_serving_commands
from pipeline.cli.measure import add_bench_command, add_cpp_commands
from pipeline.cli.train import add_train_command
from pipeline.cli.verify import add_verify_command
from pipeline.cli.versions import add_trust_options, add_version_commands, use_trust
from pipeline.core import paths
from pipeline.core.cliargs import Parser
from pipeline.core.errors import PipelineError
from pipeline.core.noise import quiet_libraries

log = logging.getLogger("pipeline")

_EPILOG = """\
stages run left to right, each reading what the one before wrote:
  pipeline train   → artifacts/<model>/checkpoint.pt (+ .json sidecar)
  pipeline export  → artifacts/<model>/export/ (TorchScript, ONNX, golden I/O, manifest.json);
                     exit 3 when only some formats could be written (see export --help)
  pipeline verify  → artifacts/<model>/parity.json + parity.md (histograms, where it diverges);
                     exit 1 on any failed check
  pipeline archive → model_store/<model>_<format>.mar, one per exported format ({suffixes})
  pipeline serve   → one format per model by default (bench's fastest, else the first
                     held in registry order, TorchScript first unless torch refuses
                     torch.jit; --all-formats for every one); then infer / loadtest / stop
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
    from pipeline.export import EXIT_PARTIAL, ExportConfig, export
    from pipeline.export.partial import one_line, partial_message, settled

    inputs, outputs = input_specs(args)
    config = ExportConfig.from_args(args, inputs=inputs, outputs=outputs)
    weights = "imported" if config.weights else "random" if config.random_init else "checkpoint"
    held = (
        settled(
            config.out_dir,
            config.model,
            config.formats,
            config.checkpoint,
            weights,
            config.seed,
            fix_axes=config.fix_axes,
            opset=config.opset,
            inputs=config.inputs,
        )
        if args.if_missing
        else None
    )
    if held is not None:
        failed = {k: v for k, v in held.failed.items() if k in config.formats}
        have = [f for f in config.formats if f not in failed]
        print(f"{config.out_dir} already holds {', '.join(have) or 'none of them'}; nothing to do")
        if not failed:
            return 0
        print(
            f"partial export: {', '.join(failed)} failed at the last export of {config.model} "
            f"({'; '.join(f'{k}: {one_line(v)}' for k, v in failed.items())}). --if-missing "
            f"does not retry a recorded failure; export without it to try again. Exit status "
            f"{EXIT_PARTIAL} (partial).",
            file=sys.stderr,
        )
        return EXIT_PARTIAL
    result = export(config)
    print(f"exported {args.model} to {result.out_dir}")
    for art in result.manifest.artifacts.values():
        reason = f": {art.reason}" if art.reason else ""
        print(f"  {art.file:22s} {art.how}{reason}")
    if result.failed:
        print(partial_message(result.manifest, result.out_dir), file=sys.stderr)
        return EXIT_PARTIAL
    return 0


_EXPORT_EPILOG = """exit status:
  0  every requested format written and checked
  1  failed: nothing written, a previous export and checkpoint are kept. Also when a
     setting cannot be honoured (--method trace refused, --pt2-device cuda without CUDA)
  2  bad arguments
  3  partial: some formats written and checked, the others could not express the model
     (e.g. an op ONNX has no conversion for), or an int8/float16 format was judged
     outside its accuracy budget (its file kept, marked outside_budget, for inspection);
     manifest.json lists them under "failed" with the reason or verdict, verify/archive/
     serve use what was written within budget, and the checkpoint
     made by --weights/--random-init is kept. With --if-missing, a format recorded as
     failed is not retried (export without --if-missing to try again) and the status is 3.
  130  interrupted (Ctrl-C): nothing written

--random-init calibrates BatchNorm/InstanceNorm running statistics on a few seeded
random batches (the statistics of a freshly built model do not match its activations)
and warns when the outputs still stay tiny; the manifest's model.init_note says what
was done and the output scale reached.
"""


def build_parser() -> argparse.ArgumentParser:
    # Only torch-free modules here: `pipeline --help` and `pipeline STAGE --help` must
    # not wait for torch (tests/unit/test_cli_imports.py); each stage function imports
    # what it needs when it runs.
    from pipeline.core.defaults import DEFAULT_ATOL, DEFAULT_RTOL
    from pipeline.formats import base as registry
    from pipeline.formats.base import DEFAULT_OPSET, METHODS
    from pipeline.serving import runtime as runtimes

    export_formats, default_formats = registry.keys(), registry.default_keys()
    parser = Parser(
        prog="pipeline",
        description="Train a PyTorch model, export it to TorchScript, ONNX, .pt2 and .pte, serve it "
        f"({', '.join(d.title for d in runtimes.declared())}), run it from C++, and prove "
        "every backend computes what eager PyTorch computes.",
        epilog=_EPILOG.format(
            suffixes=", ".join(f"_{f.served_suffix}" for f in registry.declared())
        ),
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
        help="export a checkpoint to TorchScript, ONNX, .pt2 (AOTInductor) and/or .pte (ExecuTorch)",
        description="Load a checkpoint (sha256-checked), put the model in eval mode, "
        "write TorchScript, ONNX (dynamic batch) and, with --format pt2, an AOTInductor "
        "package, with --format pte an ExecuTorch program for devices, plus golden I/O "
        "and manifest.json. A format that cannot express the model "
        "is recorded as failed while the others are written (exit status 3).",
        epilog=_EXPORT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model_arg(p)
    p.add_argument("--checkpoint", type=Path, help="default: <artifacts>/<model>/checkpoint.pt")
    p.add_argument("--out-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--format",
        action="append",
        choices=(*export_formats, registry.ALL, registry.ALL_PRECISION),
        help=f"what to write; repeat for several (default: {' and '.join(default_formats)}). "
        "pt2 is torch.export + AOTInductor, compiled for --pt2-device (tens of seconds per "
        "model); pte is ExecuTorch's on-device program (XNNPACK; verified, never served), "
        "pte_int8 its int8 variant (XNNPACK's quantizer). "
        f"{registry.ALL}: every float32 format (pte when ExecuTorch is installed); "
        f"{registry.ALL_PRECISION}: every int8 and float16 one (judged at task level, see "
        "--accuracy-budget)",
    )
    p.add_argument(
        "--pt2-device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device the .pt2 package is compiled for (default: cpu; cuda needs a GPU here)",
    )
    p.add_argument(
        "--fix-axis",
        action="append",
        metavar="AXIS=N",
        help="compile the .pt2 formats and the .pte with dynamic axis AXIS at size N only "
        "(repeatable), for a model torch.export cannot keep dynamic along it (a custom "
        "recurrent loop) or ExecuTorch runs only at one size (a loop); the other formats "
        "keep it dynamic, and verify and servers hold those to N",
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
        help="do nothing when the export folder already holds every asked-for format, "
        "or recorded it as failed (exit status 3 then), made from the same weights (the "
        "checkpoint, or --random-init with the same --seed; --weights always exports) and "
        "the same --fix-axis, --opset and --input",
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
    add_budget_args(p, export=True)
    g = p.add_argument_group(
        "models outside the zoo (module:Class, file.py:Class, torchvision:NAME)"
    )
    kwargs_arg(g)
    g.add_argument(
        "--input",
        action="append",
        metavar="NAME:DTYPE:SHAPE[:LOW:HIGH]",
        help="an input, in forward() order; repeat for several. DTYPE: float32, float64, "
        "float16, bfloat16, int64, int32 or bool. A name in SHAPE is a dynamic axis. LOW:HIGH "
        "(high exclusive) is where random inputs are drawn from (default -1:1 for floats, "
        "0:10 for integers) and, for integers, what the servers accept: --input "
        "image:float32:batch,3,32,32 or --input ids:int64:batch,seq:0:50",
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
        "--random-init",
        action="store_true",
        help="export with seeded random weights (see --seed), normalisation statistics "
        "calibrated on random batches",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for --random-init (default: 0)")
    p.set_defaults(func=_cmd_export)

    add_verify_command(sub)
    add_serving_commands(sub)
    add_version_commands(sub)
    add_cpp_commands(sub)
    add_bench_command(sub)
    add_deploy_command(sub)
    add_trust_options(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # As typed, for hints that repeat it (serve records how to start the server again).
    args.argv = list(sys.argv[1:] if argv is None else argv)
    # Our own progress at INFO; third-party chatter (the ONNX exporter's
    # optimiser passes log at INFO) only with --verbose.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # Libraries' messages about their environment (pipeline/core/noise.py) only with -v.
    quiet_libraries(args.verbose)
    # --artifacts-dir as the default of every lookup the command makes, and of the processes
    # it starts: bench's fastest.json was read from ./artifacts by serve --runtime kserve
    # and loadtest --serve, which took no artifacts folder of their own (a user's trial).
    before = os.environ.get(paths.ARTIFACTS_ENV)
    if getattr(args, "artifacts_dir", None) is not None:
        os.environ[paths.ARTIFACTS_ENV] = str(Path(args.artifacts_dir).resolve())
    try:
        use_trust(args)
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
    finally:  # main() called in-process (tests, scripts): the caller's environment again
        if before is None:
            os.environ.pop(paths.ARTIFACTS_ENV, None)
        else:
            os.environ[paths.ARTIFACTS_ENV] = before
