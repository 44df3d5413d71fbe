"""Opening an ExecuTorch `.pte` program in ExecuTorch's own Python runtime.

This is the runtime a device runs (its C++ core, the portable and optimised
kernels, the XNNPACK delegate), reached through the executorch wheel's
bindings, not torch: verify and bench therefore check the program where it
will run. ExecuTorch's most reported failure is a program that exports but
does not load, usually an operator the runtime has no kernel for
(`OperatorMissing`); the runtime only logs which one to stderr, so a load
failure here compares the operators the export recorded with the ones the
runtime registers and names the missing ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

OPERATORS_KEY = "operators"  # the manifest record's list of the program's operators
DELEGATES_KEY = "delegates"  # ...and of the backends it delegates to ("XnnpackBackend")
INSTALL = "the project's pte extra (`pip install -e '.[pte]'`; `make venv` installs it)"


class ProgramError(RuntimeError):
    """A .pte program that cannot run here: no ExecuTorch, or a program that does not load."""


@contextlib.contextmanager
def quiet_stderr() -> Iterator[list[str]]:
    """fd 2 captured: ExecuTorch's C++ runtime logs to it (XNNPACK's CPU probe on every load,
    a failed kernel's check). Yields a list that holds the text once the block ends, for
    the caller's error message."""
    text: list[str] = []
    with tempfile.TemporaryFile() as sink:
        try:
            saved = os.dup(2)
        except OSError:  # no fd 2 (a detached process): nothing to capture
            yield text
            return
        os.dup2(sink.fileno(), 2)
        try:
            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text.append(sink.read().decode(errors="replace"))


def runtime() -> Any:
    """ExecuTorch's Runtime singleton; ProgramError naming what to install without it."""
    # torchao (which executorch imports) registers an Enum as a pytree constant, a call
    # torch 2.14 logs as deprecated; nothing here uses it.
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        # Its bindings warn on import that they are an experimental API (they are what
        # ExecuTorch's own Python runtime is made of; pinned), and its modules use
        # importlib.resources calls Python 3.11 deprecates.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from executorch.runtime import Runtime

            return Runtime.get()
    except ImportError as err:
        raise ProgramError(f"ExecuTorch is not installed ({err}); install {INSTALL}.") from None
    finally:
        pytree_log.setLevel(level)


def version() -> str | None:
    """The installed executorch's version, or None."""
    from importlib import metadata

    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return None


def missing(record: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(operators, delegates) the program of `record` needs that this runtime lacks."""
    rt = runtime()
    have = set(rt.operator_registry.operator_names)
    ops = [op for op in record.get(OPERATORS_KEY) or () if op not in have]
    delegates = [
        d for d in record.get(DELEGATES_KEY) or () if not rt.backend_registry.is_available(d)
    ]
    return ops, delegates


def open_method(path: Path, record: Mapping[str, Any]) -> Callable[[Sequence[torch.Tensor]], list]:
    """The program's `forward` as a callable (tensors in forward order → output tensors).

    ProgramError when it does not load, naming the missing operators and delegates."""
    rt = runtime()
    try:
        with quiet_stderr():
            method = rt.load_program(Path(path)).load_method("forward")
        if method is None:
            raise RuntimeError("the program has no forward method")
    except RuntimeError as err:
        ops, delegates = missing(record)
        named = (
            "; this runtime has no kernel for "
            + ", ".join(ops + [f"the {d} delegate" for d in delegates])
            if ops or delegates
            else ""
        )
        raise ProgramError(
            f"ExecuTorch {version()} cannot load {Path(path).name}: {err}{named}. Export it with "
            "the same executorch version as the runtime, or without the operator."
        ) from None

    first = [True]

    def call(args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        inputs = [t.detach().cpu().contiguous() for t in args]
        if first[0]:  # a program on the CPU kernels probes the CPU then: cpuinfo's lines
            first[0] = False
            try:
                with quiet_stderr() as said:
                    outputs = method.execute(inputs)
            finally:  # the rest (a failed kernel's check) passed on, for who reads fd 2
                kept = [ln for ln in "".join(said).splitlines(True) if "cpuinfo" not in ln]
                if kept:
                    os.write(2, "".join(kept).encode())
        else:
            outputs = method.execute(inputs)
        # clone: the outputs live in the program's planned memory, which the next call reuses
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]

    return call
