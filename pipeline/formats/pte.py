"""ExecuTorch `.pte`: the on-device format, verified in ExecuTorch's own runtime.

TorchScript's mobile path (the Lite Interpreter) points users to ExecuTorch: a
`.pte` program and a runtime of a few MB, no LibTorch. The model goes through
`torch.export` (pipeline/formats/program.py: its torch.cond formulation, its
recurrent layers as `scan`), then `to_edge_transform_and_lower` with the
XNNPACK partitioner: XNNPACK takes the convolutions, matmuls and pointwise ops
it supports, and ExecuTorch's portable and optimised CPU kernels run the rest.
When the partitioner refuses the graph outright, the program is lowered
without it (every op on the CPU kernels) and the manifest says why.

ExecuTorch plans every intermediate buffer ahead of time, so each dynamic axis
needs a largest size (`MAX_BATCH`, and `max_sizes()` for the others); a program
is checked in ExecuTorch's runtime, against eager, on the golden inputs, at
batch 1 and at its largest batch, and on every probe before it is kept. Two
settings found on this machine (torch 2.14.1, executorch 1.5.1):

* the lowering runs backed-size-oblivious (as AOTInductor does, pipeline/
  formats/pt2.py): otherwise a convolution's batch specialises on the
  example's and the planned input buffer held 15 samples, not 64;
* an unbounded `Dim` is planned at the example's size: the bound is explicit.

The manifest records the backend, what was delegated (node counts and the
operators left to the CPU kernels), the program's operators and delegates (a
runtime that lacks one is named when the file does not load) and ExecuTorch's
version. The program is never served: verify and bench run it in process and
with the C++ runner (cpp_client/pte_runner, pipeline/formats/pte_runner.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch import nn

from pipeline.core.compare import compare_outputs, flatten_outputs
from pipeline.core.errors import ExportError, ExportRequestError
from pipeline.formats.base import ExportContext, Format, register
from pipeline.formats.program import captured_output, export_program, op_lines, quiet
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime import etprogram, formats
from pipeline_runtime.files import sha256_file
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger(__name__)

KEY = "pte"
FILE = "model.pte"
# The largest batch a program takes (its planned input buffers hold this many samples):
# above every batch export, verify and bench use by default (golden 8, random 7, bench 32).
MAX_BATCH = 64
# Any other dynamic axis (a sequence) takes up to this many times the example's size, and
# at least MAX_BATCH: verify's longest random length is 3× the example's.
OTHER_AXIS_FACTOR = 8
NOT_LOCALISED = (
    "ExecuTorch runs the delegated parts as opaque XNNPACK subgraphs and keeps no "
    "intermediate values; localise the same model's ONNX artifact instead "
    "(`pipeline export --format onnx`)"
)
# The runtime's log line naming the kernel that failed ("... in operator aten::copy_.: 0x12").
_FAILED_OP = re.compile(r"in operator ([\w:.]+?)\.?: 0x")
_LOG_CHECK = re.compile(r"\] Check failed \((.*)\):")
# A kernel's check on its tensors' memory layout (dim order): no size cures it.
_LAYOUT_CHECK = re.compile(r"dim_order|channels_last|contiguous", re.IGNORECASE)
# A check on sizes, or none logged: one planned size (--fix-axis) may cure it.
_SIZE_CHECK = re.compile(r"size|shape|broadcast|numel|dim|rank|bound|expand", re.IGNORECASE)
LAYOUT_WAY_OUT = (
    " The kernel refused its tensors' memory layout (dim order), which no --fix-axis "
    "changes: keep the model's tensors contiguous (remove its channels_last conversion, "
    "`.to(memory_format=torch.channels_last)` or `.contiguous(memory_format=...)`) and "
    "export again."
)


def missing() -> str | None:
    """None when ExecuTorch is installed, else what to install."""
    if etprogram.version() is None:
        return f"ExecuTorch is not installed; install {etprogram.INSTALL}"
    return None


def max_sizes(entry: ZooEntry, example: Inputs, fixed: Mapping[str, int]) -> dict[str, int]:
    """The largest size of each dynamic axis the program is planned for (fixed ones aside)."""
    sizes: dict[str, int] = {}
    for spec in entry.inputs:
        for axis, name in spec.dynamic_axes().items():
            if name in fixed or name in sizes:
                continue
            seen = int(example[spec.name].shape[axis])
            sizes[name] = MAX_BATCH if name == "batch" else max(MAX_BATCH, OTHER_AXIS_FACTOR * seen)
    return sizes


def input_sizes(program: torch.export.ExportedProgram) -> list[int]:
    """Every dim of every tensor input in forward order: its size when fixed, -1 when dynamic.

    ExecuTorch's method meta holds a tensor's largest sizes only, not which dims may vary,
    so the C++ runner could not refuse a 7x7 image for an 8x8 program; the .pte carries this
    list as the constant method INPUT_SIZES_METHOD for it to read."""
    user = set(program.graph_signature.user_inputs)
    sizes: list[int] = []
    for node in program.graph_module.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and node.name in user and isinstance(val, torch.Tensor):
            sizes += [d if isinstance(d, int) else -1 for d in val.shape]
    return sizes


# Read by cpp_client/pte_runner/main.cpp (same name there).
INPUT_SIZES_METHOD = "pipeline_input_sizes"


def lower(program: torch.export.ExportedProgram, xnnpack: bool) -> tuple[Any, dict[str, Any]]:
    """(ExecuTorch program manager, what was delegated) of `program`."""
    etprogram.runtime()  # imported quietly first (its import logs a torch deprecation)
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    partitioners = []
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioners = [XnnpackPartitioner()]
    # Backed-size-oblivious: see the module docstring.
    with quiet("ExecuTorch"), fx_config.patch(backed_size_oblivious=True):
        sizes = input_sizes(program)
        edge = to_edge_transform_and_lower(
            program,
            partitioner=partitioners,
            constant_methods={INPUT_SIZES_METHOD: sizes} if sizes else None,
        )
        info = get_delegation_info(edge.exported_program().graph_module)
        manager = edge.to_executorch()
    # forward's plan: the constant method has one of its own
    (plan,) = [p for p in manager.executorch_program.execution_plan if p.name == "forward"]
    delegated = {
        "nodes_delegated": info.num_delegated_nodes,
        "nodes_not_delegated": info.num_non_delegated_nodes,
        "subgraphs": info.num_delegated_subgraphs,
        # The model's operators XNNPACK did not take (they run on ExecuTorch's CPU kernels).
        "not_delegated": sorted(
            op
            for op, b in info.delegation_by_operator.items()
            if b.non_delegated and b.delegated == 0
        ),
    }
    extra = {
        etprogram.OPERATORS_KEY: [
            f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators
        ],
        etprogram.DELEGATES_KEY: sorted({d.id for d in plan.delegates}),
    }
    return manager, {"delegation": delegated, **extra}


def _first_line(err: Exception) -> str:
    return next((ln.strip() for ln in str(err).splitlines() if ln.strip()), "")


def lowering_error(err: BaseException, limit: int = 400) -> str:
    """`err` in one line with the exception it came from: ExecuTorch wraps a pass's failure
    in "An error occurred when running the 'X' pass" (the cause, e.g. an IndexError, was
    only in the chain), and splits its explanations over lines (the first alone read "…
    This may occur when", where ExecuTorch's own sentence ends)."""
    said = " ".join(ln.strip() for ln in str(err).splitlines() if ln.strip())
    said = re.sub(r"\s*This may occur when\s*$", "", said)
    root, seen = err, {id(err)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        root, seen = nxt, seen | {id(nxt)}
    if root is not err and _first_line(root) and _first_line(root) not in said:  # type: ignore[arg-type]
        said += f" (from {type(root).__name__}: {_first_line(root)})"  # type: ignore[arg-type]
    return said if len(said) <= limit else said[: limit - 1] + "…"


def not_lowered(
    err: Exception, model: nn.Module, example: Inputs, entry: ZooEntry, method: str
) -> ExportError:
    """ExportError for a graph ExecuTorch cannot lower, naming the operator and, where the
    model calls it, the model's own line."""
    said = lowering_error(err)
    op = re.search(r"aten\.(\w+)\.\w+ is not in Core ATen", said)
    where = op_lines(model, example, entry, {f"aten.{op.group(1)}"}, prefix=True) if op else []
    hint = f" (called at {'; '.join(where)})" if where else ""
    axes = sorted({a for s in entry.inputs for a in s.dynamic_axes().values()} - {"batch"})
    if "dynamic dimension" in said and axes:  # XNNPACK's reshape takes one dynamic axis
        fixes = " ".join(f"--fix-axis {a}=N" for a in axes)
        hint += f" Export with {fixes} to make the .pte for one length of each."
    return ExportError(
        f"ExecuTorch could not lower {entry.name!r} ({method}): {type(err).__name__}: {said}{hint}"
    )


def _fix_hint(dynamic: Mapping[str, int], example: Inputs, entry: ZooEntry) -> str:
    """The way out when the runtime refuses a program with dynamic axes: one size each.

    ExecuTorch 1.5.1 runs a loop over planned dynamic buffers (the tutorial loop, a
    `scan`) only at their largest sizes; compiled for one size of every axis it runs."""
    if not dynamic:
        return ""
    at = {}
    for spec in entry.inputs:
        for axis, name in spec.dynamic_axes().items():
            if name in dynamic:
                at.setdefault(name, int(example[spec.name].shape[axis]))
    flags = " ".join(f"--fix-axis {a}={n}" for a, n in at.items())
    return f" A .pte of one size may run: export it with {flags}."


def way_out_of(printed: str, fix_hint: str) -> str:
    """What to say after a runtime failure: `fix_hint` (--fix-axis) only where one size may
    cure it; for a layout check, the layout to change (a channels_last model's convolution
    failed the same way at every --fix-axis)."""
    found = _LOG_CHECK.search(printed)
    check = found.group(1) if found else ""
    if _LAYOUT_CHECK.search(check):
        return LAYOUT_WAY_OUT
    return fix_hint if not check or _SIZE_CHECK.search(check) else ""


def _why(err: Exception, printed: str) -> str:
    """The runtime's failure in one line: the kernel that failed and its check."""
    op = _FAILED_OP.search(printed)
    check = _LOG_CHECK.search(printed)
    found = f"ExecuTorch's {op.group(1)} kernel failed" if op else str(err).splitlines()[0]
    return found + (f" ({check.group(1)})" if check else "")


def check(
    path: Any,
    record: Mapping[str, Any],
    model: nn.Module,
    cases: list[tuple[str, Inputs]],
    *,
    atol: float,
    rtol: float,
    way_out: str = "",
    names: Sequence[str] = (),
) -> None:
    """Run the program in ExecuTorch's runtime on every case and compare with eager
    (`names`: the outputs', for a mismatch's message).
    `way_out`: what to try when one size may cure a case the runtime refuses (said after
    the failure when its check is on sizes; see way_out_of)."""
    try:
        call = etprogram.open_method(path, record)
    except etprogram.ProgramError as err:
        raise ExportError(f"{err} It was not kept.") from None
    with torch.no_grad():
        for label, inputs in cases:
            expected = flatten_outputs(model(*inputs.values()))
            with captured_output("ExecuTorch's runtime") as printed:
                try:
                    actual: Any = call(list(inputs.values()))
                except RuntimeError as err:
                    actual = err
            if isinstance(actual, Exception):
                sizes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in inputs.items())
                raise ExportError(
                    f"ExecuTorch's runtime could not run the program on the {label!r} inputs "
                    f"({sizes}): {_why(actual, printed.text)}; it was not kept."
                    f"{way_out_of(printed.text, way_out)}"
                )
            worst = compare_outputs(expected, flatten_outputs(actual), atol, rtol, names)
            if worst is not None:
                raise ExportError(
                    f"The .pte program differs from eager on {label!r} ({worst}); it was not kept."
                )


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    why = missing()
    if why:
        raise ExportRequestError(f"--format {KEY} needs ExecuTorch: {why}.")
    from pipeline.formats.pt2 import at_sizes, tiled

    entry = ctx.entry
    example = at_sizes(ctx.golden, entry, ctx.fix_axes) if ctx.fix_axes else ctx.golden
    sizes = max_sizes(entry, example, ctx.fix_axes)
    started = time.perf_counter()
    program = export_program(model, example, entry, fixed=tuple(ctx.fix_axes), bounds=sizes)
    log.info(".pte: %s; lowering to ExecuTorch with XNNPACK…", program.method)
    backend, refused = "xnnpack", ""
    try:
        manager, lowered = lower(program.program, xnnpack=True)
    except Exception as err:  # noqa: BLE001 - the partitioner's refusal: lower without it
        if type(err).__name__ == "SpecViolationError":  # not XNNPACK's: the graph itself
            raise not_lowered(err, model, example, entry, program.method) from None
        refused = f"{type(err).__name__}: {lowering_error(err, 300)}"
        log.info(".pte: XNNPACK refused the graph (%s); lowering to the CPU kernels only", refused)
        backend = "portable"
        try:
            manager, lowered = lower(program.program, xnnpack=False)
        except Exception as again:  # noqa: BLE001 - any lowering failure is an export failure
            raise not_lowered(again, model, example, entry, program.method) from None
    seconds = time.perf_counter() - started
    if backend == "xnnpack" and not lowered["delegation"]["subgraphs"]:
        backend = "portable"  # XNNPACK took nothing (the gate's sum and comparison)
        refused = "it took none of the model's operators"
    path = ctx.out_dir / FILE
    path.write_bytes(manager.buffer)
    details: dict[str, Any] = {
        "method": program.method,
        "backend": backend,
        "executorch": etprogram.version(),
        "max_sizes": sizes,
        "lower_seconds": round(seconds, 1),
        **lowered,
    }
    if refused:
        details["xnnpack_refused"] = refused  # refused the graph, or took nothing of it
    if ctx.fix_axes:
        details["fixed_axes"] = dict(ctx.fix_axes)
    if program.swaps:
        details["recurrent"] = [swap.to_json() for swap in program.swaps]
    if ctx.check:
        cases = [
            ("golden", example),
            ("golden at batch 1", tiled(example, entry, 1)),
            (f"golden tiled to batch {MAX_BATCH}", tiled(example, entry, MAX_BATCH)),
            *ctx.probes,
        ]
        kept = [
            (label, c)
            for label, c in cases
            if entry.fits(c, ctx.fix_axes) and entry.within(c, sizes)
        ]
        if len(kept) < len(cases):
            details["probes_not_checked"] = len(cases) - len(kept)
        check(
            path,
            details,
            model,
            kept,
            atol=ctx.atol,
            rtol=ctx.rtol,
            way_out=_fix_hint(sizes, example, entry),
            names=tuple(entry.outputs),
        )
    reason = program.reason + (
        f"; not delegated to XNNPACK ({refused}): every op runs on ExecuTorch's CPU kernels"
        if refused
        else ""
    )
    return ArtifactRecord(
        file=FILE, format=KEY, sha256=sha256_file(path), reason=reason, details=details
    )


FORMAT = register(
    Format(
        key=KEY,
        title="ExecuTorch .pte",
        file=FILE,
        served_suffix="pte",
        runner=formats.EXECUTORCH,
        backend="executorch",
        export=export,
        default=False,
        served=False,
        native="pipeline.formats.pte_runner",
        missing=missing,
        not_localised=NOT_LOCALISED,
        description="ExecuTorch program (XNNPACK-delegated) for devices; verified in "
        "ExecuTorch's runtime and its C++ runner, not served",
    )
)
