"""int8 ExecuTorch `.pte`: XNNPACK's quantizer, then the `.pte` lowering, judged at task level.

ExecuTorch's own int8 path (its XNNPACK tutorial): the model is captured with
`torch.export`, annotated by `XNNPACKQuantizer` (symmetric int8, per-channel weights,
static activation ranges), calibrated on the export's calibration batches
(pipeline/export/calibration.py, as the static int8 ONNX is), converted
(`torchao`'s `prepare_pt2e`/`convert_pt2e`: quantise/dequantise pairs around each
quantised op), captured again and lowered as the float `.pte` is (pipeline/formats/
pte.py): XNNPACK fuses the pairs into int8 kernels; what it does not take runs on
ExecuTorch's quantized and portable CPU kernels.

Like the other reduced formats, it is judged by the rule verify applies (accuracy on
the validation split for a zoo classifier, else top-1 agreement or SQNR: pipeline/
export/quality.py), not elementwise. The program is planned for the same largest sizes
as the float `.pte` (batch 64), so calibration batches are fed in slices of at most that
many samples (a range observer's min and max do not depend on how a batch is cut).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import ExportError, ExportRequestError
from pipeline.core.noise import library_warnings
from pipeline.formats import pte, reduced
from pipeline.formats.base import ExportContext, Format, register
from pipeline.formats.program import captured_output, export_program, quiet
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime import etprogram, formats
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger(__name__)

KEY = "pte_int8"
FILE = "model.int8.pte"
SETTINGS = {
    "quantizer": "XNNPACKQuantizer",
    "config": "get_symmetric_quantization_config",
    "per_channel": True,
    "dynamic": False,  # static activation ranges, from the calibration batches
}
# The converted graph's quantise ops: none means nothing was made int8.
_QUANTIZE = "quantize_per_tensor"


def _slices(batch: Inputs, entry: ZooEntry, most: int) -> list[Inputs]:
    """`batch` cut along its batch axis into pieces of at most `most` samples."""
    axes = {s.name: a for s in entry.inputs for a, n in s.dynamic_axes().items() if n == "batch"}
    if not axes:
        return [batch]
    size = int(next(iter(batch.values())).shape[next(iter(axes.values()))])
    return [
        {k: v.narrow(axes[k], i, min(most, size - i)) if k in axes else v for k, v in batch.items()}
        for i in range(0, size, most)
    ]


def _quantized(
    model: nn.Module, ctx: ExportContext, example: Inputs, sizes: dict[str, int]
) -> tuple[nn.Module, str, int, Any]:
    """(the converted module, the capture's method, calibration samples seen, the
    calibration). `model` is not changed: prepare_pt2e works on the captured graph."""
    from pipeline.formats.pt2_int8 import quiet_torchao_import

    with quiet_torchao_import():
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if ctx.calibration is None:  # pragma: no cover - the export stage always sets it
        raise ExportError("int8 static quantisation needs calibration data; none was given.")
    calibration = ctx.calibration()
    entry, fixed = ctx.entry, ctx.fix_axes
    captured = export_program(model, example, entry, fixed=tuple(fixed), bounds=sizes)
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    # Slices the program takes: its one batch size when fixed, else its largest.
    most = fixed.get("batch") or sizes.get("batch", pte.MAX_BATCH)
    seen = 0
    with quiet("torchao"), library_warnings("torchao"), captured_output("torchao"):
        prepared = prepare_pt2e(captured.program.module(), quantizer)
        with torch.no_grad():
            for batch in calibration.batches:
                for piece in _slices(batch, entry, most):
                    if entry.fits(piece, fixed) and entry.within(piece, sizes):
                        prepared(*piece.values())
                        seen += int(next(iter(piece.values())).shape[0])
        if not seen:
            raise ExportError(
                f"none of the calibration batches ({calibration.what}) fits the .pte's "
                f"sizes (largest {sizes}, fixed {dict(fixed)}): nothing to calibrate "
                f"{entry.name!r} on."
            )
        converted = convert_pt2e(prepared)
    if not any(_QUANTIZE in str(n.target) for n in converted.graph.nodes):
        raise ExportError(
            f"XNNPACK's quantizer annotated nothing in {entry.name!r} (no convolution, linear "
            "or other op it quantises): there is nothing int8 about it. Use --format pte."
        )
    return converted, captured.method, seen, calibration


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    why = pte.missing()
    if why:
        raise ExportRequestError(f"--format {KEY} needs ExecuTorch: {why}.")
    from pipeline.formats.pt2 import at_sizes

    entry = ctx.entry
    example = at_sizes(ctx.golden, entry, ctx.fix_axes) if ctx.fix_axes else ctx.golden
    sizes = pte.max_sizes(entry, example, ctx.fix_axes)
    started = time.perf_counter()
    try:
        converted, method, samples, calibration = _quantized(model, ctx, example, sizes)
    except ExportError:
        raise
    except Exception as err:  # noqa: BLE001 - the quantizer's failure is this format's
        raise ExportError(
            f"XNNPACK's quantizer could not quantise {entry.name!r}: {type(err).__name__}: "
            f"{pte.lowering_error(err, 300)}. Use --format pte (float32)."
        ) from None
    log.info(".pte int8: calibrated on %d samples; lowering to ExecuTorch with XNNPACK…", samples)
    program = export_program(converted, example, entry, fixed=tuple(ctx.fix_axes), bounds=sizes)
    try:
        manager, lowered = pte.lower(program.program, xnnpack=True)
    except Exception as err:  # noqa: BLE001 - any lowering failure is this format's
        raise pte.not_lowered(err, model, example, entry, method) from None
    if not lowered["delegation"]["subgraphs"]:
        raise ExportError(
            f"XNNPACK took none of {entry.name!r}'s quantised operators: the int8 program "
            "would run on reference kernels only. Use --format pte."
        )
    path = ctx.out_dir / FILE
    path.write_bytes(manager.buffer)
    details: dict[str, Any] = {
        "method": method,
        "backend": "xnnpack",
        "executorch": etprogram.version(),
        "max_sizes": sizes,
        "lower_seconds": round(time.perf_counter() - started, 1),
        "quantizer": SETTINGS,
        "calibration": calibration.record(),
        **lowered,
    }
    if ctx.fix_axes:
        details["fixed_axes"] = dict(ctx.fix_axes)
    try:  # a program that does not load is not kept (its verdict would say less)
        etprogram.open_method(path, details)
    except etprogram.ProgramError as err:
        path.unlink(missing_ok=True)
        raise ExportError(f"{err} It was not kept.") from None
    return reduced.record(
        ctx,
        key=KEY,
        path=path,
        precision="int8",
        reason=f"XNNPACKQuantizer (symmetric int8, per-channel weights, static activations "
        f"calibrated on {samples} samples), lowered to ExecuTorch with XNNPACK",
        details=details,
    )


FORMAT = register(
    Format(
        key=KEY,
        title="ExecuTorch .pte int8",
        file=FILE,
        served_suffix="pte_int8",
        runner=formats.EXECUTORCH,
        backend="executorch_int8",
        export=export,
        default=False,
        served=False,
        precision="int8",
        native="pipeline.formats.pte_runner",
        missing=pte.missing,
        not_localised=pte.NOT_LOCALISED,
        description="int8 ExecuTorch program (XNNPACK's quantizer, XNNPACK-delegated) for "
        "devices; judged at task level in ExecuTorch's runtime and its C++ runner, not served",
    )
)
