"""Arguments several subcommands share (model, kwargs, input specs, run dir)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core import paths
from pipeline.core.cliargs import add_budget_args as add_budget_args
from pipeline.core.cliargs import model_arg as model_arg
from pipeline.core.errors import InputArgumentError


def kwargs_arg(p: argparse.ArgumentParser, what: str = "constructor keyword arguments") -> None:
    p.add_argument(
        "--model-kwargs",
        metavar="JSON",
        help=f"{what} as a JSON object, e.g. '{{\"num_classes\": 10}}'",
    )


def input_specs(args: argparse.Namespace) -> tuple[list | None, list[str] | None]:
    from pipeline.zoo.user import load_spec_file, parse_input

    inputs = [parse_input(text) for text in args.input or []]
    outputs = list(args.output or [])
    if args.input_spec:
        if inputs:
            raise InputArgumentError(
                "Give inputs either with --input or with --input-spec, not both."
            )
        inputs, file_outputs = load_spec_file(args.input_spec)
        outputs = outputs or file_outputs
    return inputs or None, outputs or None


def run_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-dir",
        type=Path,
        help="where `pipeline serve` keeps its config, logs, token file and pid (default: <artifacts>/serve)",
    )


def serve_run_dir(args: argparse.Namespace) -> Path:
    return args.run_dir or paths.artifacts_root(args.artifacts_dir) / "serve"


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit inside the block, so what the command started is stopped
    on the way out: a serve's runtime (stopped_on_failure), a bench's or a loadtest's
    private server (by default the signal killed this process alone and left the
    runtime's host, Ray's cluster, TorchServe or a KServe supervisor running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def store_arg(p: argparse.ArgumentParser, running: bool = False) -> None:
    if running:  # the running server's own store unless told otherwise
        p.add_argument("--store", type=Path, help="default: the running server's, else model_store")
        return
    p.add_argument("--store", type=Path, default=paths.DEFAULT_STORE, help="default: model_store")


def running_store(args: argparse.Namespace) -> Path:
    """--store, else the store the server in the run folder was started with (recorded by
    serve), else model_store: a server started with --store refused a rollout that did not
    repeat it."""
    if args.store is not None:
        return Path(args.store)
    from pipeline.serving.server import ServeError, Server

    try:
        recorded = Server.load(serve_run_dir(args)).extras.get("store")
    except (ServeError, OSError, ValueError):
        recorded = None
    return Path(recorded) if recorded else paths.DEFAULT_STORE
