"""ONNX export with a dynamic batch axis and a deliberately chosen opset.

The `torch.export`-based exporter (`dynamo=True`) runs first. It cannot follow data-dependent
Python control flow; for zoo models with a torch.cond formulation it exports that instead
(ONNX `If`/`Scan`). Only models with no such formulation fall back to the TorchScript-based
exporter (`dynamo=False`) on the *scripted* module, which turns `prim::If`/`prim::Loop`
into ONNX `If`/`Loop` (it warns that it is deprecated)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import nn

from pipeline.core.errors import ExportError, ExportRequestError
from pipeline.core.noise import library_warnings
from pipeline.formats.base import DEFAULT_OPSET, ExportContext, Format, register
from pipeline.formats.explain import explain
from pipeline.formats.onnxssa import make_ssa
from pipeline.formats.program import captured_output, dynamic_shapes, op_lines, quiet
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime import formats, jitgate
from pipeline_runtime.files import sha256_file
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger(__name__)

# DEFAULT_OPSET (declared in base.py, where `pipeline --help` reads it without torch) is
# 18, not the exporter's default 20: ONNX Runtime's AveragePool ran several times
# slower at opset 20 than at 18 on this project's reference CPU (../shared/DESIGN.md,
# "Performance traps"), and 18 covers every op the zoo uses.
OPSET_REASON = (
    "opset 18 rather than the exporter default 20: ONNX Runtime's AveragePool ran several "
    "times slower at opset 20 on the reference CPU, and 18 covers every op used"
)


@dataclass(frozen=True)
class OnnxResult:
    exporter: str  # "torch.export (dynamo=True)" or "torchscript (dynamo=False)"
    opset: int
    reason: str


def _dynamic_axes_legacy(
    entry: ZooEntry, output_shapes: dict[str, tuple]
) -> dict[str, dict[int, str]]:
    axes = {spec.name: spec.dynamic_axes() for spec in entry.inputs}
    for name, shape in output_shapes.items():
        axes[name] = {i: d for i, d in enumerate(shape) if isinstance(d, str)}
    return axes


def _export_dynamo(
    model: nn.Module, example: Inputs, entry: ZooEntry, path: Path, opset: int
) -> None:
    with quiet("torch.onnx.export (dynamo=True)"):
        program = torch.onnx.export(
            model,
            tuple(example.values()),
            dynamo=True,
            opset_version=opset,
            input_names=[s.name for s in entry.inputs],
            output_names=list(entry.outputs),
            dynamic_shapes=dynamic_shapes(entry),
            verbose=False,
        )
    if program is None:  # pragma: no cover - dynamo=True always returns a program
        raise ExportError("torch.onnx.export returned no program")
    program.save(str(path))
    make_ssa(path)  # an output named like a module: two values of that name (onnxssa.py)


def _export_legacy(
    scripted: torch.jit.ScriptModule,
    example: Inputs,
    entry: ZooEntry,
    path: Path,
    opset: int,
    output_shapes: dict[str, tuple],
) -> None:
    # This exporter prints the TorchScript graph on any failure, and warns about its own
    # deprecation and the TorchScript module's internals: -v only (the failure itself is
    # reported).
    what = "torch.onnx.export (dynamo=False)"
    with library_warnings(what), captured_output(what):
        torch.onnx.export(
            scripted,
            tuple(example.values()),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=[s.name for s in entry.inputs],
            output_names=list(entry.outputs),
            dynamic_axes=_dynamic_axes_legacy(entry, output_shapes),
        )


def _summary(err: BaseException) -> str:
    """The line of the exporter's long report that says what went wrong."""
    return re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", _summary_line(err)).strip()


def _summary_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if line.startswith("## Exception summary") and i + 1 < len(lines):
            return lines[i + 1][:300]
    for line in lines:
        if line.startswith("<class '"):
            return line[:300]
    return lines[0][:300] if lines else type(err).__name__


# How each exporter names an op it cannot convert:
# "No ONNX function found for <OpOverload(op='aten.linalg_eig', overload='default')>"
# "Exporting the operator 'aten::linalg_eigvals' to ONNX opset version 18 is not supported"
_MISSING_OP = re.compile(r"No ONNX function found for <OpOverload\(op='(aten\.\w+)'")
_MISSING_OP_LEGACY = re.compile(r"Exporting the operator '(aten)::(\w+)' to ONNX")


def missing_ops(*errors: BaseException) -> list[str]:
    """The ATen ops ("aten.linalg_eig") the exporters said they have no conversion for."""
    found: list[str] = []
    for err in errors:
        text = str(err)
        names = _MISSING_OP.findall(text) + [
            f"{ns}.{op}" for ns, op in _MISSING_OP_LEGACY.findall(text)
        ]
        found += [n for n in names if n not in found]
    return found


def python_name(op: str) -> str | None:
    """The torch function an ATen op comes from: aten.linalg_eigvals → torch.linalg.eigvals."""
    name = op.removeprefix("aten.")
    for namespace in ("linalg", "fft", "special"):
        short = name.removeprefix(f"{namespace}_")
        if short != name and hasattr(getattr(torch, namespace), short):
            return f"torch.{namespace}.{short}"
    if hasattr(torch, name):
        return f"torch.{name}"
    if hasattr(torch.nn.functional, name):
        return f"torch.nn.functional.{name}"
    return None


def fixed_dynamic_axes(path: Path, entry: ZooEntry) -> list[str]:
    """Dynamic axes of the spec that the ONNX graph made fixed ("xs axis 0 (seq) = 5")."""
    graph_inputs = {i.name: i for i in onnx.load(str(path), load_external_data=False).graph.input}
    problems = []
    for spec in entry.inputs:
        graph_input = graph_inputs.get(spec.name)
        if graph_input is None:
            problems.append(f"input {spec.name!r} missing from the graph")
            continue
        dims = graph_input.type.tensor_type.shape.dim
        for axis, name in spec.dynamic_axes().items():
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                problems.append(f"{spec.name} axis {axis} ({name}) = {dims[axis].dim_value}")
    return problems


def _dynamo_checked(
    model: nn.Module, example: Inputs, entry: ZooEntry, path: Path, opset: int
) -> None:
    """The default exporter, rejecting a graph that made a declared dynamic axis fixed.

    torch.export specialises a size that Python code branched or looped on; the
    sequence length must stay variable.
    """
    _export_dynamo(model, example, entry, path, opset)
    fixed = fixed_dynamic_axes(path, entry)
    if fixed:
        raise ExportError(f"torch.export made dynamic axes fixed: {', '.join(fixed)}")


def to_onnx(
    model: nn.Module,
    scripted: Callable[[], tuple[torch.jit.ScriptModule, str]],
    example: Inputs,
    entry: ZooEntry,
    path: Path,
    output_shapes: dict[str, tuple],
    opset: int = DEFAULT_OPSET,
) -> OnnxResult:
    """Write `path` as ONNX; returns which exporter ran and why.

    In order: the default exporter on the model; on the model's torch.cond
    formulation, if its zoo entry has one (ONNX `If`/`Scan`); the deprecated
    TorchScript-based exporter on the scripted module (`scripted()` gives it
    and its method), for models with no such formulation.
    """
    try:
        _dynamo_checked(model, example, entry, path, opset)
        result = OnnxResult("torch.export (dynamo=True)", opset, "default exporter succeeded")
    except Exception as err:  # noqa: BLE001 - any failure moves on to the next exporter
        first = _summary(err)
        result = None
        if entry.cond_formulation is not None:
            try:
                _dynamo_checked(entry.cond_formulation(model), example, entry, path, opset)
                result = OnnxResult(
                    "torch.export (dynamo=True), torch.cond formulation",
                    opset,
                    f"the default exporter failed on the model as written ({first}); exported "
                    "the zoo's torch.cond formulation, which keeps the branch as ONNX If "
                    "(and the loop as Scan)",
                )
            except Exception as cond_err:  # noqa: BLE001 - fall back to the legacy exporter
                first += f"; on the torch.cond formulation: {_summary(cond_err)}"
        if result is None:
            result = _legacy(
                model, scripted, example, entry, path, opset, output_shapes, first, err
            )
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as err:
        raise ExportError(f"The exported ONNX file {path} failed onnx.checker: {err}") from err
    return result


def _legacy(
    model: nn.Module,
    scripted: Callable[[], tuple[torch.jit.ScriptModule, str]],
    example: Inputs,
    entry: ZooEntry,
    path: Path,
    opset: int,
    output_shapes: dict[str, tuple],
    first: str,
    err: BaseException,
) -> OnnxResult:
    if jitgate.refused():  # the fallback below starts from the model's TorchScript
        raise ExportError(f"ONNX export failed: {explain(err)} {jitgate.NO_LEGACY}.")
    try:
        module, script_method = scripted()
    except ExportRequestError:
        raise  # a --method the user chose that cannot be honoured: not ONNX's failure
    except ExportError as ts_err:
        raise ExportError(
            f"ONNX export failed: torch.export-based exporter: {first}; the TorchScript-based "
            # Its first clause only: the TorchScript format reports the rest.
            f"exporter needs the model's TorchScript, which failed too: "
            f"{' '.join(str(ts_err).split()).split('; ')[0]}"
        ) from None
    try:
        _export_legacy(module, example, entry, path, opset, output_shapes)
    except Exception as legacy_err:  # noqa: BLE001 - every exporter failed: say why, once
        raise ExportError(_failure(model, example, entry, opset, first, err, legacy_err)) from None
    kept = (
        "which keeps its control flow as ONNX If/Loop"
        if script_method in ("script", "hybrid")
        else "a trace: control flow is NOT kept"
    )
    fixed = fixed_dynamic_axes(path, entry)
    if fixed:
        raise ExportError(
            f"The ONNX graph has fixed sizes for dynamic axes ({', '.join(fixed)}) with both "
            "exporters; the model's code ties those sizes to the example inputs."
        ) from err
    return OnnxResult(
        "torchscript (dynamo=False)",
        opset,
        f"torch.export-based exporter failed ({first}); exported the {script_method} "
        f"TorchScript module instead, {kept}",
    )


def _failure(
    model: nn.Module,
    example: Inputs,
    entry: ZooEntry,
    opset: int,
    first: str,
    err: BaseException,
    legacy_err: BaseException,
) -> str:
    """Why neither exporter wrote the ONNX file, naming the op (and the model's line) when
    an op without an ONNX conversion was the cause."""
    both = f"torch.export-based exporter: {first}; TorchScript-based: {_summary(legacy_err)}"
    ops = missing_ops(err, legacy_err)
    if not ops:
        return f"ONNX export failed with both exporters: {both}"
    functions = list(dict.fromkeys(n for n in map(python_name, ops) if n))
    lines = op_lines(model, example, entry, set(ops))
    return (
        f"ONNX has no conversion for {' / '.join(ops)}"
        + (f" ({', '.join(functions)})" if functions else "")
        + (f" called at {'; '.join(lines)}" if lines else "")
        + f", in either exporter at opset {opset} ({both}). Hint: compute it with ops "
        "ONNX has, or give torch.onnx.export a custom_translation_table entry for it; "
        "formats that do not go through ONNX (TorchScript, .pt2) may still take the model."
    )


# --- the format ---------------------------------------------------------------

FILE = "model.onnx"


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    from pipeline.formats.torchscript import scripted

    log.info("ONNX (opset %d)…", ctx.opset)

    def ts() -> tuple[torch.jit.ScriptModule, str]:
        made = scripted(model, ctx)
        return made.module, made.method

    path = ctx.out_dir / FILE
    fixed: dict[str, int] = {}
    if ctx.per_sample:
        result, fixed = per_sample_trace(model, ctx, path)
    else:
        result = to_onnx(model, ts, ctx.golden, ctx.entry, path, ctx.output_shapes, ctx.opset)
    # The reduced-precision formats (pipeline/formats/reduced.py) start from this graph.
    ctx.cache["onnx_file"] = path
    ctx.cache["onnx_exporter"] = result.exporter
    return ArtifactRecord(
        file=FILE,
        format="onnx",
        sha256=sha256_file(path),
        reason=result.reason,
        details={
            "exporter": result.exporter,
            "opset": result.opset,
            "opset_reason": OPSET_REASON if ctx.opset == DEFAULT_OPSET else "set by --opset",
            **({"fixed_axes": fixed} if fixed else {}),
        },
    )


def per_sample_trace(
    model: nn.Module, ctx: ExportContext, path: Path
) -> tuple[OnnxResult, dict[str, int]]:
    """A model with per-sample outputs (a detector) the way torchvision's own ONNX tests
    export theirs: the *eager* module traced by the TorchScript-based exporter, at one
    image. torch.export stops on NMS's data-dependent sizes, and the TorchScript-based
    exporter fails on a scripted torchvision detector (BoxCoder), so neither is tried.

    The trace unrolls the per-image loop: a graph traced at batch N answers only the first
    N images of a larger batch, silently. So it is traced at batch 1 and that size is
    recorded as a fixed axis (as --fix-axis records one): verify runs it at that size and
    servers refuse other sizes with a 400. The counts of boxes stay dynamic."""
    example = {k: v[:1] for k, v in ctx.golden.items()}
    # Only the rows stay dynamic: a graph input marked dynamic would take batch 2 and
    # silently answer for the first image only; fixed, ONNX Runtime refuses it.
    rows = {n: {0: str(shape[0])} for n, shape in ctx.output_shapes.items() if shape[0] != "batch"}
    what = "torch.onnx.export (dynamo=False, traced)"
    try:
        with library_warnings(what), captured_output(what):
            torch.onnx.export(
                model,
                tuple(example.values()),
                str(path),
                dynamo=False,
                opset_version=ctx.opset,
                input_names=[s.name for s in ctx.entry.inputs],
                output_names=list(ctx.entry.outputs),
                dynamic_axes=rows,
            )
    except Exception as err:  # noqa: BLE001 - the one exporter for these models: say why
        raise ExportError(f"ONNX export of the traced model failed: {_summary(err)}") from None
    fixed = {"batch": 1}
    for spec in ctx.entry.inputs:  # the trace fixes every other dynamic axis too
        for axis, name in spec.dynamic_axes().items():
            if name != "batch":
                fixed[name] = int(example[spec.name].shape[axis])
    reason = (
        "per-sample outputs (a detector): the eager module traced by the TorchScript-based "
        "exporter, as torchvision's ONNX tests do (torch.export stops on NMS's data-dependent "
        f"sizes); the trace unrolls the per-image loop, so the graph takes "
        f"{', '.join(f'{a}={n}' for a, n in fixed.items())} only (recorded as fixed axes)"
    )
    return OnnxResult("torchscript trace (dynamo=False)", ctx.opset, reason), fixed


FORMAT = register(
    Format(
        key="onnx",
        title="ONNX",
        file=FILE,
        served_suffix="onnx",
        runner=formats.ONNXRUNTIME,
        localiser="onnx",
        backend="onnxruntime",
        platform="onnxruntime_onnx",
        export=export,
        description="torch.onnx (dynamo, else the torch.cond formulation, else TorchScript-based); "
        "run by ONNX Runtime",
    )
)
