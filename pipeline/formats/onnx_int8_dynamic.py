"""int8 ONNX, dynamic: int8 weights, activations quantised at run time, for Linear/LSTM models.

`quantize_dynamic` stores the weights of MatMul/Gemm (Linear), LSTM, GRU and
Attention as int8 and computes each activation's scale per request, so it
needs no calibration data. Convolutions are left in float32 on purpose: ONNX
Runtime's CPU provider runs the ConvInteger that dynamic quantisation makes
of them only with uint8 weights, and the static format quantises them better
anyway. A model without any of those ops has nothing to quantise dynamically:
its export of this format fails with that reason (the others are written).
"""

from __future__ import annotations

import logging

from onnxruntime.quantization import QuantType, quantize_dynamic
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.core.noise import library_warnings
from pipeline.formats import reduced
from pipeline.formats.base import ExportContext, Format, register
from pipeline.formats.program import captured_output
from pipeline_runtime import formats
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger(__name__)

KEY = "onnx_int8_dynamic"
FILE = "model.int8_dynamic.onnx"
OPS = ("MatMul", "Gemm", "LSTM", "GRU", "Attention")
# What quantize_dynamic turns them into: a graph holding none quantised nothing.
_INTEGER_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QAttention")


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    source = reduced.prepared_onnx(model, ctx)
    log.info("ONNX int8 dynamic (%s)…", ", ".join(OPS))
    path = ctx.out_dir / FILE
    what = "onnxruntime.quantization (dynamic)"
    try:
        with library_warnings(what), captured_output(what):
            quantize_dynamic(
                str(source), str(path), weight_type=QuantType.QInt8, op_types_to_quantize=OPS
            )
    except Exception as err:  # noqa: BLE001 - the quantiser's failure is this format's
        raise ExportError(
            f"ONNX Runtime could not quantise {ctx.entry.name!r} dynamically: "
            f"{type(err).__name__}: {reduced.first_line(err)}"
        ) from None
    reduced.check_graph(path, "int8 dynamic ONNX")
    ops = reduced.op_counts(path)
    quantized = sum(ops.get(op, 0) for op in _INTEGER_OPS)
    if not quantized:
        inside = [op for op in OPS if reduced.nested_ops(source).get(op)]
        if inside:  # "has none" was untrue: they sit in a loop's body
            raise ExportError(
                f"The {'/'.join(inside)} ops of {ctx.entry.name!r} are inside a loop or branch "
                "body (an ONNX Scan/Loop/If subgraph), which ONNX Runtime's dynamic quantiser "
                "does not enter: nothing was quantised."
            )
        raise ExportError(
            f"{ctx.entry.name!r} has no {'/'.join(OPS)} op for dynamic int8 quantisation "
            "(it quantises Linear and recurrent layers only; --format onnx_int8_static also "
            "quantises convolutions)."
        )
    return reduced.record(
        ctx,
        key=KEY,
        path=path,
        precision="int8",
        reason="onnxruntime.quantization.quantize_dynamic: int8 weights of "
        f"{'/'.join(OPS)}, activations quantised per request (no calibration data needed)",
        details={
            "quantizer": {"weight_type": "QInt8", "op_types": list(OPS)},
            "from": str(ctx.cache.get("onnx_exporter", "the ONNX format's file")),
            "opset": ctx.opset,
            "quantized_nodes": quantized,
        },
    )


FORMAT = register(
    Format(
        key=KEY,
        title="ONNX int8 (dynamic)",
        file=FILE,
        served_suffix="onnx_int8d",
        runner=formats.ONNXRUNTIME,
        backend="onnxruntime_int8_dynamic",
        platform="onnxruntime_onnx",
        export=export,
        default=False,
        precision="int8",
        description="int8 weights of Linear/LSTM/GRU, activations quantised per request; "
        "ONNX Runtime",
    )
)
