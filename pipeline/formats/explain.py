"""Why torch.export failed, in one sentence: the model's line, what fixed an axis, what to do.

torch.export's errors name neither the user's line nor, for a dynamic axis it
had to fix, the code that fixed it. `user_line` finds the model's frame in a
traceback; `specialisations` records, while torch.export runs, where each size
became a constant (torch logs the guard while the causing frame is on the
stack), so `explain` can say "tagger.py:19 (for t in range(x.size(1)):) fixed
`seq`" or "torch's own nn.LSTM fixed `seq`", and point to `--fix-axis`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import linecache
import logging
import os
import re
import sys
import textwrap
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pipeline.formats import recurrent
from pipeline_runtime import jitgate

_TORCH_DIR = os.path.dirname(torch.__file__)
# The exporters (formats/ and the export stage): frames there are not the model's own line.
_PIPELINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXPORT_DIRS = (os.path.join(_PIPELINE_DIR, "formats"), os.path.join(_PIPELINE_DIR, "export"))
_STDLIB = os.path.dirname(os.__file__)
_RNN_FILE = os.path.join("nn", "modules", "rnn.py")  # torch's nn.LSTM, nn.GRU, nn.RNN

COND_HINT = (
    "torch.export cannot follow a Python `if` on a tensor's value: write the branch as "
    "`torch.cond(pred, true_fn, false_fn, (operands,))` (branches must not return an input "
    "unchanged: return `x.clone()`)"
)
# Scripting is the other way out, while this torch runs torch.jit (pipeline_runtime/jitgate.py).
COND_SCRIPT_HINT = ", or export with --format torchscript/onnx, which script it"


def cond_hint() -> str:
    """What to do about a branch on a tensor's value, for this torch."""
    return COND_HINT + ("" if jitgate.refused() else COND_SCRIPT_HINT)


LOOP_HINT = (
    "a Python loop over a dynamic axis is unrolled by torch.export, fixing that axis: write it "
    "with `torch._higher_order_ops.scan`"
)


def fix_axis_hint(axes: str) -> str:
    """The way out when an axis cannot stay dynamic: one .pt2 per length."""
    example = ", ".join(f"--fix-axis {a.strip()}=N" for a in axes.split(",") if a.strip())
    return (
        f"or export with {example or '--fix-axis AXIS=N'} to make the .pt2 or .pte for that "
        "one length (the other formats keep it dynamic)"
    )


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


@dataclass(frozen=True)
class Site:
    """Where torch.export fixed a dynamic size to a constant while tracing."""

    size: int  # the constant it became
    line: str | None  # 'file.py:LINE (source)' in the model's code, when there is one
    layer: str | None  # 'nn.LSTM' when it happened inside the library's recurrent layer


class _Specialisations(logging.Handler):
    """Collects torch's "eval Eq(s0, 5) [guard added]" records, each with the live stack.

    torch.export's "Constraints violated" error names the axis and the constant
    but not where the code fixed it; the shape environment logs each such guard
    as it is added (TORCH_LOGS=dynamic), while the frame that caused it is on
    the stack.
    """

    _GUARD = re.compile(r"eval Eq\(s\d+, (\d+)\) \[guard added\]")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.sites: list[Site] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = self._GUARD.match(record.getMessage())
        if found is None or len(self.sites) > 50:
            return
        layer = line = None
        frame = sys._getframe()
        while frame is not None and (layer is None or line is None):
            code = frame.f_code
            if layer is None and code.co_filename.endswith(_RNN_FILE):
                cls = code.co_qualname.split(".")[0]
                layer = f"nn.{cls}" if cls in ("LSTM", "GRU", "RNN") else None
            if line is None and _model_frame(code.co_filename) and code.co_filename != __file__:
                source = linecache.getline(code.co_filename, frame.f_lineno).strip()
                line = _where(code.co_filename, frame.f_lineno, source)
            frame = frame.f_back
        self.sites.append(Site(int(found.group(1)), line, layer))


@contextlib.contextmanager
def specialisations() -> Iterator[list[Site]]:
    """The sites where an export inside the block fixed a size (see _Specialisations)."""
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    handler = _Specialisations()
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # torch's own handlers would print every record
    try:
        yield handler.sites
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _model_frame(filename: str) -> bool:
    """Whether a frame is the model's own code: not torch, the exporters or the stdlib."""
    if filename.startswith(_STDLIB) and "site-packages" not in filename:
        return False  # logging, contextlib: the capture's own frames
    return not filename.startswith((_TORCH_DIR, *_EXPORT_DIRS)) and filename[:1] != "<"


def _where(filename: str, lineno: int, source: str) -> str:
    name = os.path.relpath(filename) if filename.startswith(os.getcwd() + os.sep) else filename
    return f"{name}:{lineno}" + (f" ({source})" if source else "")


def _fixed_axes(text: str) -> tuple[str, int | None]:
    """("seq", 5) from "Constraints violated (seq)! … specialized it to be a constant (5)"."""
    axes = re.search(r"Constraints violated \(([^)]*)\)", text)
    size = re.search(r"specialized it to be a constant \((\d+)\)", text)
    return (axes.group(1) if axes else ""), (int(size.group(1)) if size else None)


def _what_fixed(
    axes: str, size: int | None, sites: list[Site], kept: tuple[recurrent.Swap, ...]
) -> str:
    """Which code fixed the axis, and what to do about it (the hint after "Hint:")."""
    site = next((s for s in sites if size is None or s.size == size), None)
    escape = fix_axis_hint(axes)
    if site is not None and site.layer is not None:
        named = [k for k in kept if k.kind == site.layer] or list(kept)
        which = (
            "; ".join(
                f"{k.path or '(the model)'}: {k.described} was kept as it is ({k.refused})"
                for k in named
            )
            or f"a {site.layer}"
        )
        at = f", called at {site.line}" if site.line else ""
        return (
            f"torch's own {site.layer} fixed `{axes}`{at}: {which}, and torch.export unrolls "
            f"the library layer over the sequence; {escape}"
        )
    if site is not None and site.line is not None:
        return f"{site.line} fixed `{axes}`: {LOOP_HINT}, {escape}"
    if kept:
        layers = "; ".join(f"{k.path or '(the model)'}: {k.described} ({k.refused})" for k in kept)
        return f"the recurrent layers kept as they are may have fixed it ({layers}); {escape}"
    return f"{LOOP_HINT}, {escape}"


def explain(
    err: BaseException,
    sites: list[Site] | None = None,
    kept: tuple[recurrent.Swap, ...] = (),
) -> str:
    """One sentence on why torch.export failed, with the line and what to do.

    `sites`: where the export fixed sizes (`specialisations`); `kept`: the model's
    recurrent layers that were not replaced by their scan formulation.
    """
    text = str(err)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(err).__name__)
    where = user_line(err)
    if isinstance(err, recurrent.RecurrentInputError):
        return f"torch.export failed: {text} Hint: {fix_axis_hint('seq')}."
    if "specialized it to be a constant" in text or "Constraints violated" in text:
        axes, size = _fixed_axes(text)
        what = (
            f"the code fixed the dynamic axis {axes}" if axes else "the code fixed a dynamic axis"
        )
        hint = _what_fixed(axes, size, sites or [], kept)
    elif "data-dependent" in text or "GuardOnDataDependent" in type(err).__name__:
        what, hint = "the code branches on a tensor's value", cond_hint()
        library = library_site(text)
        if library is not None:  # not the user's branch: torch.cond in their code cannot help
            called = f", called from {where}" if where else ""
            where = f"{library[0]}'s code ({library[1]}){called}"
            what = (
                "the library branches on a tensor's value: torch.cond in your code cannot remove it"
            )
            hint = LIBRARY_HINT + ("" if jitgate.refused() else LIBRARY_SCRIPT_HINT)
    else:
        what, hint = "", "see the torch.export documentation for what it supports"
    at = f" at {where}" if where else ""
    what = f" ({what})" if what else ""
    return f"torch.export failed{at}{what}: {type(err).__name__}: {_cut(first)}. Hint: {hint}."


def _cut(line: str, most: int = 200) -> str:
    """`line` up to `most` characters, cut at a space and marked (a guard's expression can
    run to thousands), without a trailing full stop."""
    return textwrap.shorten(line, most, placeholder=" …").rstrip(".")


# torch names the frame that asked for the guard: "Caused by: (torchvision/ops/boxes.py:103
# in _batched_nms_coordinate_trick)"; a path relative to a sys.path entry, or absolute.
_CAUSED = re.compile(r"Caused by: \((?:[^()]*? )?([^\s()]+\.py):(\d+) in ([\w.<>]+)\)")
LIBRARY_HINT = (
    "this model cannot be written as a .pt2 or .pte while it calls that code on values only "
    "known at run time (torchvision's detectors: `if boxes.numel() == 0` in batched NMS)"
)
LIBRARY_SCRIPT_HINT = "; export it with --format torchscript/onnx, which script or trace it"


def library_site(text: str) -> tuple[str, str] | None:
    """(package, "path:line in function") when torch.export's guard was asked for by an
    installed package's code (torchvision, torch itself), not the model's own file."""
    found = _CAUSED.search(text)
    if found is None:
        return None
    path, line, function = found.groups()
    top = path.split("/")[0] if not os.path.isabs(path) else None
    if top is None:
        parts = path.split(os.sep)
        inside = [i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")]
        if not inside or inside[-1] + 1 >= len(parts):
            return None
        top = parts[inside[-1] + 1]
    elif os.path.exists(path):  # relative to the working folder: the user's own file
        return None
    else:
        spec = importlib.util.find_spec(top) if top.isidentifier() else None
        origin = (spec.origin or "") if spec is not None else ""
        if not any(d in origin for d in ("site-packages", "dist-packages")):
            return None
    return top, f"{path}:{line} in {function}"
