"""A model's outputs as named tensors, whatever container the model returned.

One rule for every format: a tensor, or tuples/lists/dicts of them (nested),
flattened depth-first in order. A dict keeps its keys as the output names
(`{"logits": ..., "embedding": ...}`), nested ones joined with a dot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def flatten_outputs(outputs: Any) -> list[torch.Tensor]:
    """A model's output (tensor, or nested tuple/list/dict of tensors) as a flat list."""
    return [t for _, t in _walk(outputs, "")]


def output_keys(outputs: Any) -> list[str]:
    """The names a dict output gives its tensors ('' where the container has no names)."""
    return [k for k, _ in _walk(outputs, "")]


def name_outputs(outputs: Any, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Flattened outputs under `names` (the manifest's, in order)."""
    flat = flatten_outputs(outputs)
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
