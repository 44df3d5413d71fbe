"""TorchScript export that never silently keeps a wrong trace.

`torch.jit.trace` records only the path the example input took; on
data-dependent control flow it prints a `TracerWarning` and returns a graph
that is wrong for inputs taking the other branch. Here tracing is held to a
higher bar: `TracerWarning` is an error, `check_inputs` are the zoo entry's
probe inputs (chosen to drive every branch), and the traced module must match
eager on every probe. A trace that fails any of that is rejected with the
reason, and `auto` scripts the model instead.
"""

from __future__ import annotations

import copy
import linecache
import logging
import os
import re
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from pipeline.core.compare import compare_outputs, flatten_outputs
from pipeline.core.errors import ExportError, ExportRequestError
from pipeline.core.noise import library_warnings, log_warnings
from pipeline.formats.base import METHODS, ExportContext, Format, register
from pipeline.formats.per_sample import UNTRACED, PerSampleOutputs, script_losses_and_detections
from pipeline.formats.scriptrun import against_eager
from pipeline.zoo.detection import scripting_advice
from pipeline.zoo.spec import Inputs
from pipeline_runtime import formats, jitgate
from pipeline_runtime.files import sha256_file
from pipeline_runtime.manifest import ArtifactRecord
from pipeline_runtime.oplibs import OP_LIBRARIES_KEY, op_libraries_of

log = logging.getLogger(__name__)
_TORCH_DIR = os.path.dirname(torch.__file__)
# METHODS, the choices, is declared in base.py (read by `pipeline --help` without torch).
Method = Literal["auto", "trace", "script"]  # "hybrid" is a result of auto, not a choice


@dataclass(frozen=True)
class ScriptResult:
    module: torch.jit.ScriptModule
    method: str  # "trace", "script" or "hybrid"
    reason: str  # why this method, in words a user can act on


def _where(w: warnings.WarningMessage) -> str:
    """'file.py:LINE (source)' of a recorded warning: the model's own line, since
    the tracer warns from inside the Python frame that converted the tensor."""
    line = linecache.getline(w.filename, w.lineno).strip()
    name = (
        os.path.relpath(w.filename) if w.filename.startswith(os.getcwd() + os.sep) else w.filename
    )
    return f"{name}:{w.lineno}" + (f" ({line})" if line else "")


def _first_line(err: BaseException | Warning | str) -> str:
    text = str(err).strip()
    if not text:
        return type(err).__name__
    line = text.splitlines()[0]  # cut at a word, marked: "use a `NamedTuple` inste" read as said
    return line if len(line) <= 300 else line[:300].rsplit(" ", 1)[0] + " […]"


def try_trace(
    model: nn.Module,
    example: Inputs,
    probes: list[tuple[str, Inputs]],
    atol: float,
    rtol: float,
) -> tuple[torch.jit.ScriptModule | None, str]:
    """Trace strictly. Returns (module, "") or (None, why it was rejected).

    TracerWarnings are recorded rather than raised: a warning raised from the
    C++ tracer surfaces as an opaque SystemError, while a recorded one keeps
    the file and line of the model code that caused it.
    """
    check_inputs = [tuple(p.values()) for _, p in probes] or None
    failure = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            # Unchecked first: a TracerWarning rejects the trace anyway, and torch's check
            # of a trace that differs between inputs builds a diff of the two graphs, which
            # for a detector's took 90 s of a 99 s export (SSDlite, 91 classes). A trace
            # without warnings is traced again, checked against the probe inputs.
            traced = torch.jit.trace(model, tuple(example.values()), check_trace=False, strict=True)
            if not any(issubclass(w.category, torch.jit.TracerWarning) for w in caught):
                traced = torch.jit.trace(
                    model,
                    tuple(example.values()),
                    check_inputs=check_inputs,
                    check_tolerance=atol,
                    strict=True,
                )
        except torch.jit.TracingCheckError as err:
            traced, failure = (
                None,
                f"re-tracing the probe inputs gave a different graph or output ({_first_line(err)})",
            )
        except Exception as err:  # noqa: BLE001 - any tracing failure is a reason to script
            traced, failure = (
                None,
                f"torch.jit.trace raised {type(err).__name__}: {_first_line(err)}",
            )
    tracer_warnings = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    # The rest, e.g. torch.jit's deprecation FutureWarning (expected, see DESIGN.md): -v only.
    log_warnings("torch.jit.trace", [w for w in caught if w not in tracer_warnings])
    if tracer_warnings:
        # Prefer the model's own line over a warning raised inside torch.
        first = next(
            (w for w in tracer_warnings if not w.filename.startswith(_TORCH_DIR)),
            tracer_warnings[0],
        )
        more = f" (and {len(tracer_warnings) - 1} more)" if len(tracer_warnings) > 1 else ""
        return (
            None,
            f"trace rejected: TracerWarning at {_where(first)}, {_first_line(first.message).split('. ')[0]!r}{more}",
        )
    if traced is None:
        return None, f"trace rejected: {failure}"

    with torch.no_grad():
        for label, probe in probes:
            expected = flatten_outputs(model(*probe.values()))
            actual = flatten_outputs(traced(*probe.values()))
            worst = compare_outputs(expected, actual, atol=atol, rtol=rtol)
            if worst is not None:
                return (
                    None,
                    f"trace rejected: traced output differs from eager on probe {label!r} ({worst})",
                )
    return traced, ""


def try_script(model: nn.Module) -> tuple[torch.jit.ScriptModule | None, str]:
    try:
        # torch.jit's deprecation FutureWarning is expected (see DESIGN.md): -v only.
        with library_warnings("torch.jit.script", FutureWarning):
            return torch.jit.script(model), ""
    except Exception as err:  # noqa: BLE001 - TorchScript's frontend raises many types
        return None, f"script failed: {type(err).__name__}: {_first_line(err)}"


def _brief(reason: str) -> str:
    """A rejection reason without the long quoted warning text."""
    reason = reason.removeprefix("trace rejected: ")
    reason = re.sub(r", '[^']*'( \(and \d+ more\))?", "", reason)
    return reason.split(":  ")[0].rstrip(":")


def _record_child_calls(model: nn.Module, calls: list[tuple]) -> dict[str, list[tuple]]:
    """Positional inputs each direct child received while `model` ran on `calls`."""
    seen: dict[str, list[tuple]] = {}
    hooks = []
    for name, child in model.named_children():

        def hook(mod: nn.Module, args: tuple, kwargs: dict, _name: str = name) -> None:
            # Keyword calls cannot be traced positionally: scripting handles those.
            seen.setdefault(_name, []).append(None if kwargs else tuple(args))

        hooks.append(child.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            for args in calls:
                model(*args)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _compile_part(
    module: nn.Module,
    calls: list[tuple],
    path: str,
    atol: float,
    rtol: float,
    notes: list[str],
    split: bool = True,
) -> torch.jit.ScriptModule | None:
    """Trace, else script, else (when `split`) hybrid, for one (sub)module; notes say what ran."""
    usable = [c for c in calls if c is not None]
    if usable and len(usable) == len(calls):
        example = {f"arg{i}": t for i, t in enumerate(usable[0])}
        probes = [
            (f"call {i}", {f"arg{j}": t for j, t in enumerate(c)}) for i, c in enumerate(usable[1:])
        ]
        traced, rejected = try_trace(module, example, probes, atol, rtol)
        if traced is not None:
            notes.append(f"{path} traced")
            return traced
    else:
        rejected = "called with keyword arguments"
    scripted, script_failed = try_script(module)
    if scripted is not None:
        notes.append(f"{path} scripted ({_brief(rejected)})")
        return scripted
    children = _record_child_calls(module, calls) if usable and split else {}
    if not children:
        notes.append(f"{path}: {rejected}; {script_failed}")
        return None
    hybrid = copy.deepcopy(module)
    for name, child_calls in children.items():
        part = _compile_part(
            getattr(module, name), child_calls, f"{path}.{name}", atol, rtol, notes
        )
        if part is None:
            return None
        setattr(hybrid, name, part)
    outer: list[str] = []
    # split=False: the parent gets one more try around its compiled children,
    # never another round of splitting (which would recurse without end).
    again = _compile_part(hybrid, calls, path, atol, rtol, outer, split=False)
    if again is None:
        notes.append(f"{path}: no method works even with compiled submodules ({script_failed})")
        return None
    how = outer[-1].removeprefix(path).split(" (")[0].strip() if outer else "compiled"
    notes.append(f"{path} {how} around them ({_brief(rejected)}; {_brief(script_failed)})")
    return again


def to_torchscript(
    model: nn.Module,
    example: Inputs,
    probes: list[tuple[str, Inputs]],
    *,
    method: Method = "auto",
    allow_unsafe_trace: bool = False,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    check: bool = True,
) -> ScriptResult:
    """Convert an eval-mode model to TorchScript with the safest method that works.

    auto: a strict trace (no TracerWarning, re-traces on the probes agree, the
    trace matches eager on every probe); else `torch.jit.script`; else a
    hybrid as in PyTorch's TorchScript tutorial: compile each submodule the
    same way (trace, else script, else recurse), then trace or script the
    parent around the compiled parts.
    """
    if method not in METHODS:
        raise ExportError(f"Unknown method {method!r}; use one of {', '.join(METHODS)}.")
    if jitgate.refused():  # before any attempt: every torch.jit call would raise it
        raise ExportError(jitgate.refusal_message("TorchScript cannot be written"))
    if method == "script":
        scripted, why = try_script(model)
        if scripted is None:
            raise ExportRequestError(f"--method script failed: {why}. Try --method auto.")
        result = ScriptResult(scripted, "script", "scripted because --method script was given")
    else:
        if method == "auto" and isinstance(model, PerSampleOutputs):
            # A detector's per-image loop unrolls in a trace to the example's batch: a trace
            # that passed its checks would still be wrong at other batches (and tracing a
            # detector is slow: NMS per class on every call). Scripting keeps the loop.
            traced, rejected = None, UNTRACED
        else:
            traced, rejected = try_trace(model, example, probes, atol, rtol)
        if traced is not None:
            return ScriptResult(
                traced,
                "trace",
                f"traced: no TracerWarning, and the trace matched eager on all {len(probes)} probe inputs",
            )
        if method == "trace":
            if not allow_unsafe_trace:
                raise ExportRequestError(
                    f"--method trace refused: {rejected}. The model has data-dependent behaviour "
                    "that a trace would bake in. Use --method auto or --method script, or pass "
                    "--allow-unsafe-trace to keep the trace anyway (verify will show the mismatch)."
                )
            # Its TracerWarnings are in `rejected`, reported with the result: -v only.
            with library_warnings("torch.jit.trace (--allow-unsafe-trace)"):
                unsafe = torch.jit.trace(model, tuple(example.values()), check_trace=False)
            return ScriptResult(
                unsafe, "trace", f"UNSAFE trace kept by --allow-unsafe-trace; {rejected}"
            )

        scripted, script_failed = try_script(model)
        if scripted is not None:
            result = ScriptResult(scripted, "script", f"{rejected}; scripted")
        elif isinstance(model, PerSampleOutputs) and (
            answered := script_losses_and_detections(model)
        ):
            result = ScriptResult(
                answered,
                "script",
                f"{rejected}; scripted, its detections taken from the scripted torchvision "
                "detector's (losses, detections) answer",
            )
        else:
            notes: list[str] = []
            calls = [tuple(example.values())] + [tuple(p.values()) for _, p in probes]
            hybrid = _compile_part(model, calls, type(model).__name__, atol, rtol, notes)
            if hybrid is None:
                raise ExportError(
                    f"No faithful TorchScript for this model: {rejected}; {script_failed}; "
                    f"hybrid failed: {'; '.join(notes)}. {scripting_advice(model) or GENERIC_ADVICE}"
                )
            result = ScriptResult(
                hybrid, "hybrid", f"{rejected}; {script_failed}; hybrid: {'; '.join(notes)}"
            )
    mismatch = (
        against_eager(model, result.module, probes, atol, rtol, GENERIC_ADVICE) if check else None
    )
    if mismatch is not None:
        raise ExportError(
            f"The {result.method}ed TorchScript module differs from eager on {mismatch}. "
            "This is a TorchScript compiler problem, not a tracing one; please report it with the model."
        )
    return result


GENERIC_ADVICE = (
    "Make the model scriptable (type-annotate forward, move Python-only code out of it) or "
    "wrap its control flow in a submodule that can be scripted."
)


# --- the format ---------------------------------------------------------------

FILE = "model.torchscript.pt"


def scripted(model: nn.Module, ctx: ExportContext) -> ScriptResult:
    """The model's TorchScript, made once per export run (ONNX's fallback reuses it).

    A failure is kept too: when the TorchScript format failed, ONNX's fallback
    gets the same error at once instead of tracing, scripting and splitting again.
    """
    if "torchscript" not in ctx.cache:
        log.info("TorchScript (%s)…", ctx.method)
        try:
            ctx.cache["torchscript"] = to_torchscript(
                model,
                ctx.golden,
                ctx.probes,
                method=ctx.method,  # type: ignore[arg-type]
                allow_unsafe_trace=ctx.allow_unsafe_trace,
                atol=ctx.atol,
                rtol=ctx.rtol,
                check=ctx.check,
            )
        except ExportError as err:
            ctx.cache["torchscript"] = err
    made = ctx.cache["torchscript"]
    if isinstance(made, ExportError):
        raise made
    return made


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    ts = scripted(model, ctx)
    path = ctx.out_dir / FILE
    with library_warnings("torch.jit.save", FutureWarning):  # jit deprecation: see DESIGN.md
        torch.jit.save(ts.module, str(path))
    details: dict[str, object] = {"method": ts.method}
    # Libraries whose custom operators (torchvision::nms) must be loaded before the file.
    if libraries := op_libraries_of(ts.module):
        details[OP_LIBRARIES_KEY] = libraries
    sha256 = sha256_file(path)
    return ArtifactRecord(FILE, "torchscript", sha256, reason=ts.reason, details=details)


FORMAT = register(
    Format(
        key="torchscript",
        title="TorchScript",
        file=FILE,
        served_suffix="ts",
        runner=formats.TORCHSCRIPT,
        localiser="torchscript",
        backend="torchscript",
        platform="pytorch_libtorch",
        export=export,
        cpp=True,
        description="torch.jit trace (strict, probe-checked) or script, else a hybrid",
        needs_jit=True,
    )
)
