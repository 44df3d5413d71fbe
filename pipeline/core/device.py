"""Device selection shared by training, export and verify."""

from __future__ import annotations

import logging

import torch

from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """'auto' → first CUDA device if present, else CPU; 'cuda[:N]' must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise PipelineError(
            f"Unknown device {name!r}. Use 'auto', 'cpu', 'cuda' or 'cuda:N' (for example 'cuda:0')."
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise PipelineError(
                f"Device {name!r} was asked for but CUDA is not available on this machine. "
                "Use --device cpu (or auto)."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise PipelineError(
                f"Device {name!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)."
            )
    elif device.type != "cpu":
        raise PipelineError(f"Device {name!r} is not supported. Use 'auto', 'cpu' or 'cuda[:N]'.")
    return device


def resolve_indexed(name: str) -> torch.device:
    """`resolve_device`, with CUDA named by its index ("cuda" → cuda:0): how a runner
    reports where it runs, so callers compare and print one spelling."""
    device = resolve_device(name)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
