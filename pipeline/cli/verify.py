"""The `pipeline verify` subcommand: parses arguments and calls the verify stage."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pipeline.cli.args import add_budget_args, model_arg, run_dir_arg, serve_run_dir

log = logging.getLogger("pipeline")

# pipeline.verify.backends.CPP, spelled here because that module imports torch and
# `pipeline verify --help` must not (tests/unit/test_cli_imports.py checks that
# backend_names() and the runtimes are what --backend offers).
_CPP = "cpp"


def backend_names() -> tuple[str, ...]:
    """What `--backend` accepts: pipeline.verify.backends.backend_names() and every
    runtime's name, without torch."""
    from pipeline.formats import base as registry
    from pipeline.serving import runtime

    return (*(f.backend for f in registry.declared()), _CPP, *runtime.names())


def add_verify_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="compare every backend with eager PyTorch",
        description="Run every backend and eager PyTorch on the golden inputs, the model's "
        "probe inputs and fresh random batches; print a table (max abs/rel error, p99, the "
        "reference's scale, the smallest passing atol/rtol, top-1 agreement for classifiers), "
        "write parity.json and a Markdown report with |error| histograms, and exit 1 listing "
        "every failed check. A failing backend is localised: the first module whose output "
        "departs from eager's is named. Failure kinds: tolerance, shape, non-finite (NaN/Inf), "
        "missing output, crashed, and vacuous (a tolerance so large that all zeros would pass). "
        "int8 and float16 formats are judged at task level instead: the accuracy drop on the "
        "validation split, top-1 agreement, or SQNR, against the budget export recorded.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model_arg(p, export_dir=True)
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--checkpoint", type=Path, help="eager reference (default: the one in the manifest)"
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=backend_names(),
        default=None,
        help="backend to check; repeat for several (default: the in-process backend of every "
        "format the export holds, plus the running server's when one started by `pipeline serve` "
        "serves the model; a runtime's name checks that runtime's server, e.g. torchserve, or "
        "kserve over REST and gRPC)",
    )
    p.add_argument(
        "--with-cpp",
        action="store_true",
        help="with the default backends, also run the C++ clients on every format they run: "
        "the LibTorch client (TorchScript, .pt2) and the ExecuTorch runner (.pte, no LibTorch)",
    )
    p.add_argument(
        "--cpp-build-dir",
        type=Path,
        help="the C++ client's build folder, as given to `pipeline build-cpp --build-dir`; "
        "built there when missing or older than its sources, once a format it runs is "
        "checked (default: cpp_client/build)",
    )
    p.add_argument(
        "--pte-build-dir",
        type=Path,
        help="ExecuTorch's runner's build folder (cpp/pte), as given to `pipeline build-cpp "
        "--runner pte --build-dir`; built there the same way (default: "
        "cpp_client/pte_runner/build)",
    )
    p.add_argument("--atol", type=float, help="absolute tolerance (default: the manifest's)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: the manifest's)")
    p.add_argument(
        "--atol-scale",
        type=float,
        metavar="FRACTION",
        help="absolute tolerance relative to each output's scale: atol = FRACTION * max|eager "
        "output|, per output and input set (replaces --atol; e.g. 1e-4)",
    )
    p.add_argument(
        "--allow-vacuous",
        action="store_true",
        help="accept checks whose tolerance cannot tell the output from zeros (they are "
        "reported as a note instead of failing)",
    )
    p.add_argument(
        "--bisect",
        action="store_true",
        help="when the ONNX backend fails, also write the smallest failing ONNX subgraph "
        "(runnable alone, with its inputs) beside the report",
    )
    p.add_argument(
        "--inputs",
        action="append",
        type=Path,
        default=[],
        metavar="FILE.npz",
        help="also check every backend on these inputs (a .npz of named arrays, each with "
        "its batch axis): e.g. a sample the shadow check kept in <run dir>/shadow/, to "
        "replay a divergence (repeatable)",
    )
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
        "--device",
        default="cpu",
        metavar="{cpu,cuda,cuda:N}",
        help="where the in-process backends and the C++ client run (default: cpu); eager, "
        "the reference, runs on CPU; a format without a CUDA path (ONNX Runtime without its "
        "CUDA provider, a .pt2 compiled for CPU, ExecuTorch) runs on CPU and the report says so",
    )
    p.add_argument(
        "--report",
        type=Path,
        help="JSON report path (default: <artifacts>/<model>/parity.json, or X.parity.json "
        "beside an --export-dir X); the Markdown report "
        "and its histograms go beside it (parity.md, parity_files/)",
    )
    add_budget_args(p)
    run_dir_arg(p)
    p.set_defaults(func=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    from pipeline.serving import runtime
    from pipeline.serving.checks import served_backends
    from pipeline.verify import VerifyConfig, open_for, verify

    args.served_names = runtime.names()
    config = VerifyConfig.from_args(args)
    config.validate()
    exported = open_for(config)  # once: the served backends and verify share it
    served = []
    if config.backends is None or set(config.backends) & set(config.served_names):
        run_dir = serve_run_dir(args)
        served = served_backends(
            config.backends, config.model, exported.manifest, run_dir, exported.dir
        )
    report = verify(config, served=served, exported=exported)
    report.print_table()
    report.raise_for_failures()  # a ParityError subclass per failure kind; the CLI exits 1
    return 0
