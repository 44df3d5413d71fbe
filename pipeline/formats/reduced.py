"""What the reduced-precision formats share: the float graph they start from, the
calibration reader, and the record that carries their task-level verdict.

Each reduced-precision format is its own module (`onnx_int8_static.py`,
`onnx_int8_dynamic.py`, `onnx_fp16.py`) registered like any other; this module
is not a format. The export stage measures each artifact of one of them by the
rule verify applies (pipeline/export/quality.py), and the manifest records,
beside its sha256: its precision, its size on disk, where its calibration came
from, the budget it was held to and the verdict (`quality`). A verdict outside the budget
does not stop the export (the table of what was traded for what needs it), but
it is logged as a warning, verify fails on it, and serve never picks it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnxruntime.quantization import CalibrationDataReader
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.formats.base import ExportContext
from pipeline.zoo.spec import Inputs
from pipeline_runtime.files import sha256_file
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger(__name__)

FLOAT_ONNX = "onnx_file"  # ctx.cache key: the float32 ONNX file of this export run


def float_onnx(model: nn.Module, ctx: ExportContext) -> Path:
    """The float32 ONNX graph a reduced-precision format starts from.

    The ONNX format's own file when it was written in this run (it runs first,
    in registry order), else one exported into the scratch folder, which the
    export stage removes: it must not ship unless asked for.
    """
    cached = ctx.cache.get(FLOAT_ONNX)
    if cached is not None and Path(cached).is_file():
        return Path(cached)
    from pipeline.formats.onnx import to_onnx
    from pipeline.formats.torchscript import scripted

    def ts() -> tuple[torch.jit.ScriptModule, str]:
        made = scripted(model, ctx)
        return made.module, made.method

    folder = ctx.scratch or Path(tempfile.mkdtemp(prefix="pipeline-onnx-"))
    path = folder / "float32.onnx"
    log.info("float32 ONNX graph for the reduced-precision formats…")
    result = to_onnx(model, ts, ctx.golden, ctx.entry, path, ctx.output_shapes, ctx.opset)
    ctx.cache[FLOAT_ONNX] = path
    ctx.cache["onnx_exporter"] = result.exporter
    return path


def prepared_onnx(model: nn.Module, ctx: ExportContext) -> Path:
    """The float32 graph after `quant_pre_process` (shape inference, graph optimisation:
    BatchNorm folded into Conv/Gemm), the input ONNX Runtime's quantisers recommend.

    The exporter's own shape annotations can disagree with a quantised node's (a
    dynamic quantiser transposing a Gemm weight failed shape inference on them);
    the pre-processed graph carries freshly inferred ones.
    """
    cached = ctx.cache.get("onnx_prepared")
    if cached is not None and Path(cached).is_file():
        return Path(cached)
    from onnxruntime.quantization import quant_pre_process

    from pipeline.core.noise import library_warnings
    from pipeline.formats.program import captured_output

    source = float_onnx(model, ctx)
    path = scratch_file(ctx, "float32.prepared.onnx")
    what = "onnxruntime.quantization.quant_pre_process"
    try:
        with library_warnings(what), captured_output(what):
            quant_pre_process(str(source), str(path))
    except Exception as err:  # noqa: BLE001 - the pre-processor's failure is the format's
        raise ExportError(
            f"ONNX Runtime's quantisation pre-processing failed on {ctx.entry.name!r}: "
            f"{type(err).__name__}: {first_line(err)}"
        ) from None
    ctx.cache["onnx_prepared"] = path
    return path


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else ""


def scratch_file(ctx: ExportContext, name: str) -> Path:
    folder = ctx.scratch or Path(tempfile.mkdtemp(prefix="pipeline-onnx-"))
    return folder / name


class CalibrationReader(CalibrationDataReader):
    """onnxruntime.quantization's reader over the export's calibration batches: one
    {input name: numpy array} feed per batch, then None."""

    def __init__(self, batches: list[Inputs], names: list[str]) -> None:
        self._feeds: Iterator[dict[str, np.ndarray]] = iter(
            [{n: b[n].detach().cpu().numpy() for n in names} for b in batches]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def check_graph(path: Path, title: str) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as err:
        raise ExportError(f"The {title} file {path.name} failed onnx.checker: {err}") from err


def op_counts(path: Path) -> dict[str, int]:
    """How many nodes of each op type the graph holds (top level)."""
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def nested_ops(path: Path) -> dict[str, int]:
    """The op types inside the graph's subgraphs (a Scan's, Loop's or If's bodies), which
    `op_counts` and the quantisers do not enter."""
    counts: dict[str, int] = {}

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    for inner in sub.node:
                        counts[inner.op_type] = counts.get(inner.op_type, 0) + 1
                    walk(sub)

    walk(onnx.load(str(path), load_external_data=False).graph)
    return dict(sorted(counts.items()))


def record(
    ctx: ExportContext,
    *,
    key: str,
    path: Path,
    precision: str,
    reason: str,
    details: dict[str, Any],
) -> ArtifactRecord:
    """The manifest record of a reduced-precision artifact. The export stage adds its
    verdict (`quality`, pipeline/export/quality.py) once the format has written it."""
    from pipeline.core.budget import Budget

    budget = ctx.budget or Budget()
    return ArtifactRecord(
        file=path.name,
        format=key,
        sha256=sha256_file(path),
        reason=reason,
        details={
            **details,
            "precision": precision,
            "budget": budget.to_json() | {"min_sqnr_db": budget.sqnr_for(precision)},
        },
    )
