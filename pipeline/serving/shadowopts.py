"""`--shadow RATE` and `--shadow-max-rate N`: the live shadow check's options, declared
once for every runtime that takes them (the CLI shares an option two runtimes declare
alike: pipeline.cli.deploy), and checked the same way."""

from __future__ import annotations

import argparse

from pipeline.serving.server import ServeError

DEFAULT_MAX_RATE = 20.0


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--shadow",
        type=float,
        default=0.0,
        metavar="RATE",
        help="re-run this share of answered requests (0 to 1, e.g. 0.01) on eager PyTorch "
        "in a process beside each worker, off the hot path, under the export's own rule; "
        "counts on /metrics (pipeline_shadow_*), divergences logged and kept in "
        "<run dir>/shadow/ for `pipeline verify --inputs` (default: 0, off)",
    )
    group.add_argument(
        "--shadow-max-rate",
        type=float,
        default=DEFAULT_MAX_RATE,
        metavar="N",
        help="the most samples each worker's check runs a second; beyond it samples are "
        f"dropped and counted (default: {DEFAULT_MAX_RATE:g})",
    )


def check_rates(rate: float, max_rate: float) -> None:
    """ServeError unless RATE is a share and N a positive rate, naming only what is wrong
    (`--shadow 2` also blamed the default --shadow-max-rate 20)."""
    wrong = []
    if not 0 <= rate <= 1:
        wrong.append(f"--shadow is a share of requests from 0 to 1 (e.g. 0.01), got {rate:g}")
    if max_rate <= 0:
        wrong.append(f"--shadow-max-rate is a positive rate, got {max_rate:g}")
    if wrong:
        raise ServeError("; ".join(wrong) + ".")
