"""argparse types for numbers with a range, so a bad value is a usage error naming the
option (`error: argument --port: 70000 is not a port (1 to 65535)`), never a traceback
from the socket layer, a Java stack or a setting silently ignored."""

from __future__ import annotations

import argparse


def port(text: str) -> int:
    """A TCP port to listen on: 1 to 65535 (0 would let the system pick one that the
    server's record and its clients could not name)."""
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (1 to 65535)")
    return value


def positive_int(text: str) -> int:
    """A count of at least 1 (workers, threads, a batch size, bytes)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def non_negative_float(text: str) -> float:
    """A delay or a share of 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):  # NaN fails `>= 0`
        raise argparse.ArgumentTypeError(f"{text} must be a finite number, 0 or more")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
