"""A model's outputs as named tensors, whatever container the model returned.

One rule for every format: a tensor, or tuples/lists/dicts of them (nested),
flattened depth-first in order. A dict keeps its keys as the output names
(`{"logits": ..., "embedding": ...}`), nested ones joined with a dot.

One structure is kept apart: **per-sample outputs**, torchvision's detection answer,
a list with one `{"boxes": [n_i, 4], "scores": [n_i], "labels": [n_i]}` dict per image
whose counts n_i vary with the input. Flattening it would give 3 outputs per image, so
their number would follow the batch. Instead each field is concatenated over the
images, batch-major, and a last output `counts` ([batch], int64) says how many rows
each image has (`collate`). Export records the structure in the manifest
(`per_sample`); every format, every server and the C++ client answer in this form.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

# A scripted torchvision detector warns, on its first call in each process, that it
# answers (losses, detections) when scripted: the project takes the detections from that
# answer (pipeline/zoo/detection.py), so the warning only alarms (export.md: exporters'
# own output is kept out).
warnings.filterwarnings(
    "ignore", message=r"\w+ always returns a \(Losses, Detections\) tuple in scripting"
)


def flatten_outputs(outputs: Any) -> list[torch.Tensor]:
    """A model's output (tensor, or nested tuple/list/dict of tensors) as a flat list."""
    return [t for _, t in _walk(outputs, "")]


def output_keys(outputs: Any) -> list[str]:
    """The names a dict output gives its tensors ('' where the container has no names)."""
    return [k for k, _ in _walk(outputs, "")]


COUNTS = "counts"  # the per-image row counts of per-sample outputs


def per_sample_fields(outputs: Any, batch: int) -> tuple[str, ...] | None:
    """The fields of a per-sample output (a list of `batch` dicts with the same keys, each
    value a tensor whose first axis is that sample's count), else None."""
    if not isinstance(outputs, list) or len(outputs) != batch or not outputs:
        return None
    if not all(isinstance(d, dict) and d for d in outputs):
        return None
    keys = list(outputs[0])
    for d in outputs:
        values = list(d.values())
        if list(d) != keys or not all(isinstance(v, torch.Tensor) and v.ndim for v in values):
            return None
        if len({int(v.shape[0]) for v in values}) != 1:
            return None
    return tuple(str(k) for k in keys)


def collate(outputs: Sequence[dict[str, Any]], fields: Sequence[str]) -> list[torch.Tensor]:
    """Per-sample outputs as flat tensors: each field concatenated over the samples, then
    the counts (int64, one per sample)."""
    flat = [torch.cat([d[f] for d in outputs], 0) for f in fields]
    counts = torch.tensor([int(d[fields[0]].shape[0]) for d in outputs], dtype=torch.int64)
    return [*flat, counts]


def split_samples(named: dict[str, Any], fields: Sequence[str]) -> list[dict[str, Any]]:
    """The inverse of `collate` on named arrays or tensors: one dict of fields per sample.
    A request sent without its batch axis is answered with `counts` a scalar: one sample."""
    out, start = [], 0
    for n in [int(c) for c in np.atleast_1d(np.asarray(named[COUNTS]))]:
        out.append({f: named[f][start : start + n] for f in fields})
        start += n
    return out


def _per_sample(outputs: Any, names: Sequence[str]) -> list[torch.Tensor] | None:
    if not names or names[-1] != COUNTS or not isinstance(outputs, list):
        return None
    fields = per_sample_fields(outputs, len(outputs))
    if fields is None or list(fields) != list(names[:-1]):
        return None
    return collate(outputs, fields)


def name_outputs(outputs: Any, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Flattened outputs under `names` (the manifest's, in order); per-sample outputs
    collated (`collate`) when the names say so (their fields, then `counts`)."""
    flat = _per_sample(outputs, names) or flatten_outputs(outputs)
    if len(flat) != len(names):
        raise ValueError(f"the model returned {len(flat)} outputs, the manifest names {len(names)}")
    return dict(zip(names, flat, strict=True))


def _walk(value: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if isinstance(value, np.ndarray):
        return [(prefix, torch.from_numpy(value))]
    if isinstance(value, dict):
        return [
            item
            for k, v in value.items()
            for item in _walk(v, f"{prefix}.{k}" if prefix else str(k))
        ]
    if isinstance(value, list | tuple):
        return [item for v in value for item in _walk(v, prefix)]
    raise TypeError(f"unsupported model output type {type(value).__name__}")
