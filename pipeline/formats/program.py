"""torch.export for the exporters built on it (AOTInductor `.pt2`, the default ONNX exporter).

`torch.export` cannot follow data-dependent Python control flow: an `if` on a
tensor's value fails, and a Python loop over a dynamic axis fixes that axis.
Zoo models with such code carry a `torch.cond` formulation (`ZooEntry.
cond_formulation`) that computes the same thing; `export_program` falls back
to it, and for a user's model it says which line failed and what to write
instead. The library's recurrent layers (nn.LSTM, nn.GRU, nn.RNN) fix the
sequence axis too, inside torch: they are swapped for their `scan`
formulation first (pipeline/formats/recurrent.py). When an axis is still
fixed, the message names what fixed it (the layer, or the model's line) and
the way out, `--fix-axis AXIS=N`.

A trace can also bound an axis without fixing it: code that branches on a size
(`if x.shape[0] <= 1000`), or a kernel that picks its backend from one (CUDA's
batch norm guards the batch at 65535). A caller that checks its inputs at run time
(the `.pt2`: AOTI_RUNTIME_CHECK_INPUTS) may take torch.export's suggested range
instead of failing (`bounded=True`); the bound is recorded and said.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.core.noise import library_warnings
from pipeline.formats import recurrent
from pipeline.formats.explain import explain, node_line, specialisations
from pipeline.zoo.spec import Inputs, ZooEntry


@dataclass(frozen=True)
class Program:
    program: torch.export.ExportedProgram
    method: str  # "torch.export", "torch.export (torch.cond formulation)", "… (nn.LSTM → scan …)"
    reason: str
    swaps: tuple[recurrent.Swap, ...] = ()  # the recurrent layers found, replaced or not
    bounded_axes: dict[str, int] = field(default_factory=dict)  # axis → the largest size it takes


def dynamic_shapes(
    entry: ZooEntry, fixed: Collection[str] = (), bounds: Mapping[str, int] | None = None
) -> tuple[dict[int, torch.export.Dim], ...]:
    """torch.export's dynamic_shapes for the entry's named dynamic axes, but `fixed` ones.

    One `Dim` per axis name, so inputs sharing "batch" share its size. `bounds`: the
    largest size of an axis (ExecuTorch plans its memory for it), else unbounded.
    """
    bounds = bounds or {}
    dims: dict[str, torch.export.Dim] = {}
    shapes = []
    for spec in entry.inputs:
        axes = {}
        for axis, name in spec.dynamic_axes().items():
            if name in fixed:
                continue
            dims.setdefault(
                name,
                torch.export.Dim(name, max=bounds[name])
                if name in bounds
                else torch.export.Dim(name),
            )
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


@dataclass
class Captured:
    """What a `captured_output` block printed, once it has ended."""

    text: str = ""


@contextlib.contextmanager
def captured_output(what: str) -> Iterator[Captured]:
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
    captured = Captured()
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
                yield captured
        finally:
            if saved is not None:
                _flush_c_streams()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            sink.seek(0)
            text = sink.read().decode(errors="replace") + py_out.getvalue() + py_err.getvalue()
            captured.text = text
            if text.strip() and log.isEnabledFor(logging.DEBUG):
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


def _export(
    model: nn.Module,
    example: Inputs,
    entry: ZooEntry,
    fixed: Collection[str] = (),
    bounds: Mapping[str, int] | None = None,
    bounded: bool = False,
) -> tuple[torch.export.ExportedProgram, dict[str, int]]:
    """The program, and the axes it was bounded to (`bounded`: torch.export's suggested
    ranges taken when its only complaint is that the trace bounded a dynamic axis)."""
    shapes = dynamic_shapes(entry, fixed, bounds)
    args = tuple(example.values())
    with quiet():
        try:
            return torch.export.export(model, args, dynamic_shapes=shapes, strict=False), {}
        except torch._dynamo.exc.UserError as err:
            refined = _ranges_only(err, shapes) if bounded else None
            if refined is None:
                raise
        program = torch.export.export(model, args, dynamic_shapes=refined[0], strict=False)
    return program, refined[1]


def _ranges_only(
    err: torch._dynamo.exc.UserError, shapes: tuple[dict[int, torch.export.Dim], ...]
) -> tuple[tuple[dict[int, torch.export.Dim], ...], dict[str, int]] | None:
    """`shapes` with torch.export's suggested fixes, and each axis's new largest size, when
    every fix only lowers a dynamic axis's maximum; None when one fixes an axis to a
    constant or ties it to another (explained as a fixed axis instead)."""
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    if "Suggested fixes:" not in err.msg:
        return None
    try:
        refined = refine_dynamic_shapes_from_suggested_fixes(err.msg, shapes)
    except Exception:  # noqa: BLE001 - a fix the helper cannot read: not a range
        return None
    maxima: dict[str, int] = {}
    for old_axes, new_axes in zip(shapes, refined, strict=True):
        for axis, old in old_axes.items():
            new = new_axes.get(axis)
            if not isinstance(new, type(old)) or new.__name__ != old.__name__:
                return None  # specialised to a constant, or derived from another axis
            if new.min > max(old.min, 2):
                return None  # a raised minimum: small batches would be refused
            if new.max < old.max:
                maxima[new.__name__] = int(new.max)
    return (tuple(refined), maxima) if maxima else None


def op_lines(
    model: nn.Module, example: Inputs, entry: ZooEntry, ops: set[str], *, prefix: bool = False
) -> list[str]:
    """Where the model calls the ATen ops `ops` ("aten.linalg_eigvals"): its own lines.
    `prefix`: also the ops whose names start with one of them (a decomposition's name,
    aten.linalg_eig, finds the op the model called, aten.linalg_eigvals).

    Best effort, for an error message: torch.export records each node's Python
    stack; an empty list when the model cannot be exported or none matches.
    """
    try:
        program, _ = _export(model, example, entry)
    except Exception:  # noqa: BLE001 - only an error message's detail is lost
        return []
    found: list[str] = []
    for node in program.graph.nodes:
        packet = getattr(node.target, "overloadpacket", node.target)  # aten.x.default → aten.x
        name = str(packet)
        if node.op == "call_function" and (
            name in ops or (prefix and any(name.startswith(op) for op in ops))
        ):
            line = node_line(node.meta.get("stack_trace"))
            if line and line not in found:
                found.append(line)
    return found


def export_program(
    model: nn.Module,
    example: Inputs,
    entry: ZooEntry,
    fixed: Collection[str] = (),
    bounds: Mapping[str, int] | None = None,
    bounded: bool = False,
) -> Program:
    """`torch.export` of `model` (its recurrent layers as `scan`), or of its torch.cond
    formulation when it has one. `fixed`: dynamic axes exported at the example's size;
    `bounds`: the other axes' largest sizes (`dynamic_shapes`); `bounded`: accept the
    largest sizes the trace needs (module docstring) and say them in the reason.

    Raises `ExportError` naming the failing line, or what fixed an axis, when neither works.
    """
    scanned = recurrent.scan_formulation(model)
    swaps = scanned.swaps if scanned else ()
    target, method, reason = model, "torch.export", "the model as written"
    if scanned is not None and scanned.replaced:
        target = scanned.model
        kinds = ", ".join(dict.fromkeys(s.kind for s in scanned.replaced))
        method = f"torch.export ({kinds} → scan formulation)"
        reason = (
            "; ".join(s.describe() for s in scanned.replaced)
            + " (torch.export's own lowering fixes the sequence axis)"
        )
    if fixed:
        reason += (
            "; compiled for "
            + ", ".join(f"{a}={n} only" for a, n in _sizes(example, entry, fixed).items())
            + " (--fix-axis)"
        )
    with specialisations() as sites:
        try:
            program, maxima = _export(target, example, entry, fixed, bounds, bounded)
            if maxima:
                reason += (
                    "; compiled for "
                    + ", ".join(f"{a} ≤ {n}" for a, n in maxima.items())
                    + " only (the traced code branches on that size; torch.export's range)"
                )
            return Program(program, method, reason, swaps, maxima)
        except Exception as err:  # noqa: BLE001 - any failure is explained or retried below
            first = explain(err, sites, scanned.kept if scanned else ())
    if entry.cond_formulation is None:
        raise ExportError(first) from None
    twin = entry.cond_formulation(model)
    try:
        program, _ = _export(twin, example, entry, fixed, bounds)
    except Exception as err:  # noqa: BLE001 - the formulation itself failed: report both
        raise ExportError(
            f"{first} The model's torch.cond formulation failed too: {explain(err)}"
        ) from None
    return Program(
        program,
        "torch.export (torch.cond formulation)",
        f"{first.split('. Hint:')[0]}; exported the zoo's torch.cond formulation instead, "
        "which computes the same function with the branch as torch.cond",
        swaps,
    )


def _sizes(example: Inputs, entry: ZooEntry, axes: Collection[str]) -> dict[str, int]:
    """The example's size of each named axis in `axes`."""
    sizes: dict[str, int] = {}
    for spec in entry.inputs:
        for axis, name in spec.dynamic_axes().items():
            if name in axes and spec.name in example:
                sizes.setdefault(name, int(example[spec.name].shape[axis]))
    return sizes
