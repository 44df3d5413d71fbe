"""Which axes of a model's outputs are dynamic, and which input axis each one follows.

The golden run alone cannot tell: the tagger's `tag_logits` came out (2, 16, 9) at
batch 2 and sequence 16, and the manifest recorded (batch, 16, 9), so the served
metadata (`GET /v2/models/lstm_tagger`, REST and gRPC) said every answer has 16 steps
while a request of 5 got 5. So the model runs once more with every named input axis at
another size (each moved by its own step, so two axes of one size are told apart): an
output axis that moves with an input axis takes its name, one that moves otherwise is
named after its output (`tag_logits_1`), and one that stays is its size.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime.outputs import flatten_outputs

log = logging.getLogger(__name__)


def _axis_sizes(entry: ZooEntry, inputs: Inputs) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for spec in entry.inputs:
        for i, d in enumerate(spec.shape):
            if isinstance(d, str):
                sizes.setdefault(d, int(inputs[spec.name].shape[i]))
    return sizes


def output_shapes(
    entry: ZooEntry,
    model: nn.Module,
    golden_inputs: Inputs,
    golden_outputs: Sequence[torch.Tensor],
) -> dict[str, tuple[int | str, ...]]:
    """Each output's shape, a named axis where it follows an input's (see the module)."""
    before = _axis_sizes(entry, golden_inputs)
    after = {a: n + step for step, (a, n) in enumerate(sorted(before.items()), start=1)}
    moved: list[torch.Tensor] | None = None
    if after:
        try:
            sample = entry.sample_inputs(after, torch.Generator().manual_seed(1))
            with torch.no_grad():
                moved = flatten_outputs(model(*sample.values()))
        except Exception as err:  # noqa: BLE001 - a model that takes one size: as recorded
            log.debug("outputs at other sizes not measured (%s): only batch is named", err)
    out = {}
    for k, (name, t) in enumerate(zip(entry.outputs, golden_outputs, strict=True)):
        other = moved[k] if moved is not None and k < len(moved) else None
        if other is None or other.ndim != t.ndim:
            batch = before.get("batch")
            out[name] = tuple(
                "batch" if i == 0 and n == batch else n for i, n in enumerate(t.shape)
            )
            continue
        dims: list[int | str] = []
        for i, (n, m) in enumerate(zip(t.shape, other.shape, strict=True)):
            follows = [a for a in before if (before[a], after[a]) == (n, m)]
            dims.append(n if n == m else follows[0] if follows else f"{name}_{i}")
        out[name] = tuple(dims)
    return out
