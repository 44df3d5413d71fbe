"""Forward passes within a `.pt2`'s bounded batch (`bounded_axes`, pipeline/formats/program.py).

A package compiled for "batch ≤ N" refuses a larger batch. A server stacks requests into
one forward pass (KServe's batcher, Ray's `serve.batch`, TorchServe's handler), so a pass
can hold more samples than any one request: it is split into passes of at most N samples
along each input's batch axis and the outputs joined along theirs. Samples are
independent along the batch axis, so the answers are those of the stacked pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pipeline_runtime.manifest import Manifest

Forward = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def batch_bound(manifest: Manifest, fmt: str) -> int | None:
    """The most samples one pass of artifact `fmt` takes along the batch axis, or None."""
    if fmt not in manifest.artifacts:
        return None
    bounded = manifest.artifact(fmt).details.get("bounded_axes") or {}
    found = [
        int(bounded[spec.shape[axis]])
        for spec in manifest.inputs
        if (axis := spec.batch_axis) is not None and spec.shape[axis] in bounded
    ]
    return min(found) if found else None


def axis_bounds(manifest: Manifest, fmt: str) -> dict[str, int]:
    """The largest size each named axis but the batch takes in artifact `fmt` (a .pt2's
    `bounded_axes`): requests past it are refused (request.Limits.max_axes). The batch
    axis is not refused: passes are split to its bound instead (`within_bound`)."""
    if fmt not in manifest.artifacts:
        return {}
    bounded = manifest.artifact(fmt).details.get("bounded_axes") or {}
    batch = {s.shape[s.batch_axis] for s in manifest.inputs if s.batch_axis is not None}
    return {str(axis): int(n) for axis, n in bounded.items() if axis not in batch}


def within_bound(
    forward: Forward,
    input_axes: dict[str, int | None],
    output_axes: Sequence[int],
    bound: int | None,
) -> Forward:
    """`forward`, its passes split to at most `bound` samples (itself when `bound` is None
    or an input has no batch axis to split along)."""
    if bound is None or any(axis is None for axis in input_axes.values()):
        return forward
    first, axis = next(iter(input_axes.items()))

    def split(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        samples = batch[first].shape[axis or 0]
        if samples <= bound:
            return forward(batch)
        parts = [
            forward(
                {
                    name: np.take(batch[name], range(start, min(start + bound, samples)), axis=ax)
                    for name, ax in input_axes.items()
                }
            )
            for start in range(0, samples, bound)
        ]
        return [np.concatenate([p[i] for p in parts], axis=ax) for i, ax in enumerate(output_axes)]

    return split
