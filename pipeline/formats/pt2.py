"""`.pt2`: torch.export + AOTInductor, the successor of TorchScript for C++ deployment.

`torch.jit.trace`/`script` are deprecated in torch 2.14; PyTorch points C++
users to `torch.export` compiled ahead of time by AOTInductor into a package
that `torch._inductor.aoti_load_package` (Python) and
`torch::inductor::AOTIModelPackageLoader` (C++) run. The batch and sequence
axes are declared dynamic; the compiled package is checked against eager on
every probe before it is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.fx.experimental._config as fx_config
from torch import nn

from pipeline.core.compare import compare_outputs, flatten_outputs
from pipeline.core.errors import ExportError, ExportRequestError
from pipeline.formats.base import ExportContext, Format, register
from pipeline.formats.program import export_program, quiet
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime import formats
from pipeline_runtime.files import sha256_file
from pipeline_runtime.manifest import ArtifactRecord
from pipeline_runtime.runners import aoti_load, full_float32

log = logging.getLogger(__name__)

Pt2Device = Literal["cpu", "cuda"]

# AOTInductor options every package is compiled with:
# * check_lowerbound off: torch.export assumes a dynamic size is at least 2, and
#   with the runtime input check on (below) a batch of 1 was refused; the
#   kernels themselves are right for 1 (checked against eager on every probe).
# * dynamic_threads: read the thread count at run time (torch.set_num_threads,
#   OMP_NUM_THREADS) instead of baking in the exporting machine's count.
INDUCTOR_CONFIGS: dict[str, object] = {
    "aot_inductor.check_lowerbound": False,
    "cpp.dynamic_threads": True,
}
# A batch larger than any export and verify use by default (golden 8, random 7),
# and than the benchmark's 32: the package is checked on it at export.
LARGE_BATCH = 40


@dataclass(frozen=True)
class Pt2Result:
    method: str
    reason: str
    device: str
    compile_seconds: float
    details: dict[str, object]  # the recurrent layers swapped, the axes fixed (for the manifest)


def load_package(path: Path, device: str = "cpu") -> object:
    """The compiled package as a callable (inputs in forward order → outputs), inputs checked."""
    # -1: the package's own device (cuda:0 for a CUDA package); N: cuda:N.
    index = torch.device(device).index
    return aoti_load(path, -1 if index is None else index)


def _to(inputs: Inputs, device: str) -> Inputs:
    return {k: v.to(device).contiguous() for k, v in inputs.items()}


def tiled(inputs: Inputs, entry: ZooEntry, batch: int = LARGE_BATCH) -> Inputs:
    """`inputs` cut or repeated along their batch axis to `batch` samples."""
    out = {}
    for spec in entry.inputs:
        t = inputs[spec.name]
        if "batch" in spec.shape:
            axis = spec.shape.index("batch")
            reps = -(-batch // t.shape[axis])
            # contiguous: the package's input check holds strides to the exported ones
            t = t.repeat_interleave(reps, dim=axis).narrow(axis, 0, batch).contiguous()
        out[spec.name] = t
    return out


def to_pt2(
    model: nn.Module,
    example: Inputs,
    probes: list[tuple[str, Inputs]],
    entry: ZooEntry,
    path: Path,
    *,
    device: Pt2Device = "cpu",
    atol: float,
    rtol: float,
    check: bool = True,
    fix_axes: Mapping[str, int] | None = None,
    configs: Mapping[str, object] | None = None,
) -> Pt2Result:
    """Export `model`, compile it into `path` and check the package on every probe.

    `fix_axes` ({"seq": 32}): dynamic axes compiled at one size (--fix-axis); the
    example is drawn at that size and only probes of that size are checked.
    `configs`: AOTInductor settings on top of INDUCTOR_CONFIGS (bench's sweep).
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise ExportRequestError(
            "--pt2-device cuda needs CUDA at export time (AOTInductor compiles for the device "
            "it runs on), and none is available here. Export on a GPU machine or use "
            "--pt2-device cpu."
        )
    if device == "cuda":  # eager and the package compared in float32, as served
        full_float32()
    fix_axes = dict(fix_axes or {})
    skipped = 0
    if fix_axes:
        example = at_sizes(example, entry, fix_axes)
        kept = [(label, p) for label, p in probes if entry.fits(p, fix_axes)]
        skipped, probes = len(probes) - len(kept), kept
    model = model.to(device)
    example = _to(example, device)
    # bounded: the package checks its inputs' sizes, so a range the trace needed is safe.
    program = export_program(model, example, entry, fixed=tuple(fix_axes), bounded=True)
    log.info(".pt2: %s; compiling with AOTInductor (this takes a while)…", program.method)
    started = time.perf_counter()
    try:
        # Backed-size-oblivious: without it, the fake convolution picks a backend
        # from the example's batch size and Inductor bakes the guard it took
        # into the package: a CNN exported with a batch of 8 refused every
        # batch above 15 (torch 2.14).
        with quiet("AOTInductor"), fx_config.patch(backed_size_oblivious=True):
            torch._inductor.aoti_compile_and_package(
                program.program,
                package_path=str(path),
                inductor_configs={**INDUCTOR_CONFIGS, **(configs or {})},
            )
    except Exception as err:  # noqa: BLE001 - any compiler failure is an export failure
        first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        raise ExportError(
            f"AOTInductor could not compile {entry.name!r} ({program.method}): "
            f"{type(err).__name__}: {first[:300]}"
        ) from None
    seconds = time.perf_counter() - started
    runner = load_package(path, device)
    checks = [("golden", example), (f"golden tiled to batch {LARGE_BATCH}", tiled(example, entry))]
    if program.bounded_axes:  # inputs past a bound are refused by the package, as they should be
        kept = [(label, p) for label, p in probes if entry.within(p, program.bounded_axes)]
        skipped += len(probes) - len(kept)
        probes = kept
        checks = [(label, p) for label, p in checks if entry.within(p, program.bounded_axes)]
    with torch.no_grad():
        for label, inputs in [*checks, *probes] if check else []:
            inputs = _to(inputs, device)
            expected = flatten_outputs(model(*inputs.values()))
            try:
                actual = flatten_outputs(runner(*inputs.values()))
            except RuntimeError as err:
                raise ExportError(
                    f"The AOTInductor package of {entry.name!r} refused the {label!r} inputs: "
                    f"{str(err).splitlines()[0][:300]}; it was not kept."
                ) from None
            worst = compare_outputs(expected, actual, atol=atol, rtol=rtol)
            if worst is not None:
                raise ExportError(
                    f"The AOTInductor package of {entry.name!r} differs from eager on probe "
                    f"{label!r} ({worst}); it was not kept."
                )
    details: dict[str, object] = {}
    if program.swaps:
        details["recurrent"] = [swap.to_json() for swap in program.swaps]
    if fix_axes:
        details["fixed_axes"] = fix_axes
    if program.bounded_axes:
        details["bounded_axes"] = program.bounded_axes
    if skipped:
        details["probes_not_checked"] = skipped  # of other sizes than the fixed or bounded ones
    return Pt2Result(program.method, program.reason, device, seconds, details)


def at_sizes(example: Inputs, entry: ZooEntry, sizes: Mapping[str, int]) -> Inputs:
    """`example` with the axes in `sizes` at those sizes: itself when it already fits, else
    inputs drawn from the spec (seeded) with its other sizes kept."""
    if entry.fits(example, sizes):
        return example
    kept: dict[str, int] = {}
    for spec in entry.inputs:
        for axis, name in spec.dynamic_axes().items():
            kept.setdefault(name, int(example[spec.name].shape[axis]))
    generator = torch.Generator().manual_seed(0)
    return entry.sample_inputs({**entry.sizes(), **kept, **sizes}, generator)


# --- the format ---------------------------------------------------------------


def settings_record(ctx: ExportContext) -> dict[str, object]:
    """The manifest's record of a package's AOTInductor settings and where they came from."""
    changes = ctx.pt2_settings.get("changes") or {}
    return {
        "inductor_configs": {**INDUCTOR_CONFIGS, **changes},
        "settings_from": ctx.pt2_settings.get("from") or "the built-in settings",
    }


FILE = "model.pt2"
# What verify's localise says of a mismatch in it (Format.not_localised).
NOT_LOCALISED = (
    "AOTInductor compiles the whole graph into one library and keeps no intermediate "
    "values; localise the same model's ONNX or TorchScript artifact instead "
    "(`pipeline export --format onnx --format torchscript`)"
)


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    log.info(".pt2 (torch.export + AOTInductor, %s)…", ctx.pt2_device)
    path = ctx.out_dir / FILE
    try:
        result = to_pt2(
            model,
            ctx.golden,
            ctx.probes,
            ctx.entry,
            path,
            device=ctx.pt2_device,  # type: ignore[arg-type]
            atol=ctx.atol,
            rtol=ctx.rtol,
            check=ctx.check,
            fix_axes=ctx.fix_axes,
            configs=ctx.pt2_settings.get("changes"),
        )
    finally:
        model.to("cpu")  # the next format (and the golden outputs) run on CPU
    return ArtifactRecord(
        file=FILE,
        format="pt2",
        sha256=sha256_file(path),
        reason=result.reason,
        details={
            "method": result.method,
            "device": result.device,
            "compile_seconds": round(result.compile_seconds, 1),
            # What the package was compiled with, and why (docs/export.md, ".pt2 from Python").
            **settings_record(ctx),
            **result.details,
        },
    )


FORMAT = register(
    Format(
        key="pt2",
        title=".pt2 (AOTInductor)",
        file=FILE,
        served_suffix="pt2",
        runner=formats.AOTI,
        not_localised=NOT_LOCALISED,
        backend="pt2",
        platform="pytorch_aoti",
        export=export,
        # Opt-in: AOTInductor compiles C++ for each model (tens of seconds on a small CPU).
        default=False,
        cpp=True,
        description="torch.export + AOTInductor package, compiled for --pt2-device",
    )
)
