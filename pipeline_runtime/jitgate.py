"""TorchScript's sunset: whether this torch still runs `torch.jit`, and what to say when not.

torch 2.14 warns on every `torch.jit.script`, `trace`, `load` and `save`; PyTorch PR
#189705 turns those warnings into a RuntimeError with the same text unless
TORCH_2_14_ONLY_UNSAFE_SILENCE_TORCHSCRIPT_ERROR holds the exact promise below (read once,
when torch is imported). Under that refusal the pipeline leaves TorchScript out of its
defaults and of `--format all`, says so once, and carries on with ONNX and `.pt2`
(docs/export.md, "TorchScript's sunset").

`refused()` asks torch once per process, with a `torch.jit.load` of a directory: torch
refuses before it looks at the path, and a torch that still runs TorchScript answers
with its "is a directory" ValueError without reading anything.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings

ESCAPE_ENV = "TORCH_2_14_ONLY_UNSAFE_SILENCE_TORCHSCRIPT_ERROR"
ESCAPE_VALUE = "I promise to migrate by 2.15"

ADVICE = (
    "ONNX and .pt2 (torch.export) do not need torch.jit. To keep TorchScript meanwhile, pin "
    "the torch this project is tested with (torch==2.14.1, as pyproject.toml and "
    f'docs/export.md say), or start the pipeline with {ESCAPE_ENV}="{ESCAPE_VALUE}" in its '
    "environment: PyTorch's own temporary escape hatch, read when torch is imported"
)

# Why ONNX's fallback for code torch.export cannot follow is gone, and what to do instead.
NO_LEGACY = (
    "The TorchScript-based exporter, the other way to ONNX, cannot run: this torch refuses "
    "torch.jit (TorchScript's sunset). Written as the hint says, the model goes through the "
    "default exporter, and into .pt2 too"
)


def is_refusal(err: BaseException) -> bool:
    """Whether `err` is torch refusing a `torch.jit` entry point (not a TorchScript error)."""
    if not isinstance(err, RuntimeError):
        return False
    text = str(err)
    return "torch.jit" in text and (
        "is deprecated" in text or "is not supported in Python 3.14" in text
    )


@functools.cache
def refused() -> str:
    """torch's refusal, one line, when this torch refuses `torch.jit`; "" when it runs it."""
    import torch

    probe = os.path.dirname(torch.__file__)  # a directory: nothing is read
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the 2.14 FutureWarning: expected (DESIGN.md)
            torch.jit.load(probe)
    except RuntimeError as err:
        if is_refusal(err):
            return str(err).strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - any other answer is torch.jit at work
        pass
    return ""


_said: set[str] = set()


def say_once(log: logging.Logger, what: str) -> None:
    """One WARNING per process for `what` ("TorchScript is left out of the export", say)."""
    why = refused()
    if not why or what in _said:
        return
    _said.add(what)
    log.warning("This torch refuses torch.jit (%s): %s. %s.", why, what, ADVICE)


def refusal_message(what: str) -> str:
    """`what` ("TorchScript cannot be written") and why, for an error when torch refuses."""
    return f"{what}: this torch refuses torch.jit ({refused()}). {ADVICE}."
