"""torch.export for the exporters built on it (AOTInductor `.pt2`, the default ONNX exporter).

`torch.export` cannot follow data-dependent Python control flow: an `if` on a
tensor's value fails, and a Python loop over a dynamic axis fixes that axis.
Zoo models with such code carry a `torch.cond` formulation (`ZooEntry.
cond_formulation`) that computes the same thing; `export_program` falls back
to it, and for a user's model it says which line failed and what to write
instead.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.core.noise import library_warnings
from pipeline.zoo.spec import Inputs, ZooEntry

_TORCH_DIR = os.path.dirname(torch.__file__)
# The exporters (formats/ and the export stage): frames there are not the model's own line.
_PIPELINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXPORT_DIRS = (os.path.join(_PIPELINE_DIR, "formats"), os.path.join(_PIPELINE_DIR, "export"))

COND_HINT = (
    "torch.export cannot follow a Python `if` on a tensor's value: write the branch as "
    "`torch.cond(pred, true_fn, false_fn, (operands,))` (branches must not return an input "
    "unchanged: return `x.clone()`), or export with --format torchscript/onnx, which script it"
)
LOOP_HINT = (
    "a Python loop over a dynamic axis is unrolled by torch.export, fixing that axis: write it "
    "with `torch._higher_order_ops.scan`, or declare the axis with a fixed size"
)


@dataclass(frozen=True)
class Program:
    program: torch.export.ExportedProgram
    method: str  # "torch.export" or "torch.export (torch.cond formulation)"
    reason: str


def dynamic_shapes(entry: ZooEntry) -> tuple[dict[int, torch.export.Dim], ...]:
    """torch.export's dynamic_shapes for the entry's named dynamic axes.

    One `Dim` per axis name, so inputs sharing "batch" share its size.
    """
    dims: dict[str, torch.export.Dim] = {}
    shapes = []
    for spec in entry.inputs:
        axes = {}
        for axis, name in spec.dynamic_axes().items():
            dims.setdefault(name, torch.export.Dim(name))
            axes[axis] = dims[name]
        shapes.append(axes)
    return tuple(shapes)


log = logging.getLogger(__name__)


def _flush_c_streams() -> None:
    """Flush C stdio: LibTorch prints through std::cout (synced with C stdio), which
    buffers when fd 1 is a file, so its text must be out before the fd is put back."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output(what: str) -> Iterator[None]:
    """Run with everything printed captured, then logged at DEBUG (`pipeline -v` shows it).

    Both levels are captured: Python's sys.stdout/sys.stderr, and file
    descriptors 1 and 2, because some of torch's dumps come from C++. The
    TorchScript-based ONNX exporter prints "Torch IR graph at exception: graph(...)"
    to std::cout on every failure (torch 2.14 turns its ONNX log on
    unconditionally: `setup_onnx_logging` tests the function
    `_C._jit_is_onnx_log_enabled` instead of calling it).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    _flush_c_streams()
    py_out, py_err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryFile() as sink:
        try:
            saved = (os.dup(1), os.dup(2))
        except OSError:  # no fd 1/2 (a detached process): Python's streams only
            saved = None
        try:
            if saved is not None:
                os.dup2(sink.fileno(), 1)
                os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                yield
        finally:
            if saved is not None:
                _flush_c_streams()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            if log.isEnabledFor(logging.DEBUG):
                sink.seek(0)
                text = sink.read().decode(errors="replace") + py_out.getvalue() + py_err.getvalue()
                if text.strip():
                    log.debug("%s printed:\n%s", what, text.rstrip())


@contextlib.contextmanager
def quiet(what: str = "torch.export") -> Iterator[None]:
    """Keep torch's progress, warnings and the graphs it prints on failure from the user.

    The failure's summary reaches the user through the manifest and the CLI;
    what torch printed, and its warnings, are logged at DEBUG (`pipeline -v`).
    """
    torch_log = logging.getLogger("torch")
    level = torch_log.level
    if not log.isEnabledFor(logging.DEBUG):  # with -v its records join what was printed
        torch_log.setLevel(logging.ERROR)
    try:
        with captured_output(what), library_warnings(what):
            yield
    finally:
        torch_log.setLevel(level)


def user_line(err: BaseException) -> str | None:
    """'file.py:LINE (source)' of the model code where torch.export gave up.

    The deepest traceback frame outside torch and the export stage is the
    model's own line (non-strict torch.export runs the model's Python as written).
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        frames = [
            f
            for f in traceback.extract_tb(err.__traceback__)
            if not f.filename.startswith((_TORCH_DIR, *_EXPORT_DIRS)) and f.filename[0] != "<"
        ]
        if frames:
            f = frames[-1]
            name = os.path.relpath(f.filename) if f.filename.startswith(os.getcwd()) else f.filename
            return f"{name}:{f.lineno}" + (f" ({f.line.strip()})" if f.line else "")
        err = err.__cause__ or err.__context__
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n[ \t]*([^\n]*)')


def node_line(stack_trace: str | None) -> str | None:
    """'file.py:LINE (source)' of the model code an FX node came from.

    `stack_trace` is the node's `meta["stack_trace"]`, innermost frame last;
    the deepest frame outside torch and the exporters is the model's own line.
    """
    frames = [
        (path, line, source.strip())
        for path, line, source in _FRAME.findall(stack_trace or "")
        if not path.startswith((_TORCH_DIR, *_EXPORT_DIRS)) and path[0] != "<"
    ]
    if not frames:
        return None
    path, line, source = frames[-1]
    name = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
    return f"{name}:{line}" + (f" ({source})" if source else "")


def explain(err: BaseException) -> str:
    """One sentence on why torch.export failed, with the line and what to do."""
    text = str(err)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(err).__name__)
    where = user_line(err)
    if "specialized it to be a constant" in text or "Constraints violated" in text:
        what, hint = "the code fixed a dynamic axis", LOOP_HINT
    elif "data-dependent" in text or "GuardOnDataDependent" in type(err).__name__:
        what, hint = "the code branches on a tensor's value", COND_HINT
    else:
        what, hint = "", "see the torch.export documentation for what it supports"
    at = f" at {where}" if where else ""
    what = f" ({what})" if what else ""
    return f"torch.export failed{at}{what}: {type(err).__name__}: {first[:200]}. Hint: {hint}."


def _export(model: nn.Module, example: Inputs, entry: ZooEntry) -> torch.export.ExportedProgram:
    with quiet():
        return torch.export.export(
            model, tuple(example.values()), dynamic_shapes=dynamic_shapes(entry), strict=False
        )


def op_lines(model: nn.Module, example: Inputs, entry: ZooEntry, ops: set[str]) -> list[str]:
    """Where the model calls the ATen ops `ops` ("aten.linalg_eigvals"): its own lines.

    Best effort, for an error message: torch.export records each node's Python
    stack; an empty list when the model cannot be exported or none matches.
    """
    try:
        program = _export(model, example, entry)
    except Exception:  # noqa: BLE001 - only an error message's detail is lost
        return []
    found: list[str] = []
    for node in program.graph.nodes:
        packet = getattr(node.target, "overloadpacket", node.target)  # aten.x.default → aten.x
        if node.op == "call_function" and str(packet) in ops:
            line = node_line(node.meta.get("stack_trace"))
            if line and line not in found:
                found.append(line)
    return found


def export_program(model: nn.Module, example: Inputs, entry: ZooEntry) -> Program:
    """`torch.export` of `model`, or of its torch.cond formulation when it has one.

    Raises `ExportError` naming the failing line when neither works.
    """
    try:
        return Program(_export(model, example, entry), "torch.export", "the model as written")
    except Exception as err:  # noqa: BLE001 - any failure is explained or retried below
        first = explain(err)
        if entry.cond_formulation is None:
            raise ExportError(first) from None
    twin = entry.cond_formulation(model)
    try:
        program = _export(twin, example, entry)
    except Exception as err:  # noqa: BLE001 - the formulation itself failed: report both
        raise ExportError(
            f"{first} The model's torch.cond formulation failed too: {explain(err)}"
        ) from None
    return Program(
        program,
        "torch.export (torch.cond formulation)",
        f"{first.split('. Hint:')[0]}; exported the zoo's torch.cond formulation instead, "
        "which computes the same function with the branch as torch.cond",
    )
