"""Export's side of per-sample outputs (a detector's boxes, scores, labels per image): the
entry's output names and shapes, and the model every format is handed
(pipeline/formats/per_sample.py). The structure itself is pipeline_runtime/outputs.py's."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.formats.per_sample import PerSampleOutputs
from pipeline.zoo.spec import ZooEntry
from pipeline_runtime.outputs import COUNTS

# The name of the axis along which every image's rows (detections) follow each other.
ROWS_AXIS = "detections"


def per_sample_entry(
    entry: ZooEntry, model: nn.Module, fields: tuple[str, ...]
) -> tuple[ZooEntry, nn.Module]:
    """`entry` with the collated outputs' names (the fields, then counts), and `model`
    wrapped to answer them; a clear error for what the wrapper cannot take."""
    names = (*fields, COUNTS)
    if COUNTS in fields:
        raise ExportError(
            f"{entry.name!r} returns per-sample dicts with a field named {COUNTS!r}, the name "
            "the pipeline gives the per-sample counts: rename that field."
        )
    if entry.outputs and tuple(entry.outputs) != names:
        raise ExportError(
            f"{entry.name!r} returns one dict per sample with fields {list(fields)}: its outputs "
            f"are then {list(names)} (each field concatenated over the batch, then the counts), "
            f"not {list(entry.outputs)}. Pass {' '.join(f'--output {n}' for n in names)}, or none."
        )
    if len(entry.inputs) != 1:
        raise ExportError(
            f"{entry.name!r} returns per-sample dicts: only models with one input tensor (a "
            f"batch of images) are supported that way, it has {len(entry.inputs)}."
        )
    # Requests are not stacked: a sample's detections depend on the batch they ran in only
    # through its own image, but the answer of a stack cannot be split one row per sample.
    # torchvision:<detector> entries said so themselves; a user's wrapper did not, and both
    # servers split stacked answers row by row (wrong detections, 200, under concurrency).
    serving = {**entry.serving, "stack_requests": False}
    return replace(entry, outputs=names, serving=serving), PerSampleOutputs(model, fields).eval()


def per_sample_shapes(entry: ZooEntry, outputs: list[torch.Tensor]) -> dict[str, tuple]:
    """Each field's shape with its rows along ROWS_AXIS; the counts one per sample."""
    shapes: dict[str, tuple] = {
        name: (ROWS_AXIS, *t.shape[1:])
        for name, t in zip(entry.outputs[:-1], outputs[:-1], strict=True)
    }
    shapes[COUNTS] = ("batch",)
    return shapes
