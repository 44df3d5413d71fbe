"""The `pipeline verify` subcommand: parses arguments and calls the verify stage."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from pipeline.cli.args import model_arg, run_dir_arg, serve_run_dir
from pipeline.core.errors import PipelineError

log = logging.getLogger("pipeline")

# pipeline.verify.backends' CPP, SERVED and KSERVE, spelled here because that module
# imports torch and `pipeline verify --help` must not (tests/unit/test_cli_imports.py
# checks that backend_names() equals what --backend offers).
_OTHER_BACKENDS = ("cpp", "torchserve", "kserve")


def backend_names() -> tuple[str, ...]:
    """What `--backend` accepts: pipeline.verify.backends.backend_names(), without torch."""
    from pipeline.formats import base as registry

    return (*(f.backend for f in registry.declared()), *_OTHER_BACKENDS)


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
        "missing output, crashed, and vacuous (a tolerance so large that all zeros would pass).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model_arg(p)
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
        "format the export holds, plus torchserve when a server started by `pipeline serve` "
        "serves the model; kserve checks the KServe runtime over REST and gRPC)",
    )
    p.add_argument(
        "--with-cpp",
        action="store_true",
        help="with the default backends, also run the LibTorch C++ client on every format it runs",
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
        "--report",
        type=Path,
        help="JSON report path (default: <artifacts>/<model>/parity.json); the Markdown report "
        "and its histograms go beside it (parity.md, parity_files/)",
    )
    run_dir_arg(p)
    p.set_defaults(func=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    from pipeline.verify import VerifyConfig, verify

    config = VerifyConfig.from_args(args)
    report = verify(config, served=_served_backends(args, config))
    report.print_table()
    report.raise_for_failures()  # a ParityError subclass per failure kind; the CLI exits 1
    return 0


def _served_backends(args: argparse.Namespace, config: Any) -> list:
    """The served backends for verify: TorchServe's when asked with --backend torchserve,
    or by default when a server started by `pipeline serve` serves the model; the KServe
    runtime's (REST and gRPC) when asked with --backend kserve."""
    from pipeline.verify.backends import KSERVE, SERVED

    asked = set(config.backends or ()) & {SERVED, KSERVE}
    if not asked and config.backends is not None:
        return []
    from pipeline.core.manifest import read_manifest

    manifest = read_manifest(config.export_dir)
    if KSERVE in asked:
        from pipeline.runtimes.kserve.parity import kserve_backends

        found = kserve_backends(config.model, manifest, serve_run_dir(args))
        return found + (_torchserve(args, config, manifest) if SERVED in asked else [])
    if asked:
        return _torchserve(args, config, manifest)
    try:
        return _torchserve(args, config, manifest)
    except PipelineError as err:  # no server for this model: the local backends only
        from pipeline.runtimes.torchserve.parity import StaleServerError

        # A server of this model that answers from another export is worth knowing about.
        stale = isinstance(err, StaleServerError)
        log.log(logging.WARNING if stale else logging.INFO, "not checking a served model: %s", err)
        return []


def _torchserve(args: argparse.Namespace, config: Any, manifest: Any) -> list:
    from pipeline.runtimes.torchserve.parity import served_backends

    return served_backends(config.model, manifest, serve_run_dir(args), config.export_dir)
