"""What a request may be: the size limits, the input contract, and the error that refuses one.

Shared by the decoders (`pipeline_runtime.codec` for JSON and the v2
protocol, `pipeline_runtime.binary` for NumPy and image bodies) and by the
gateway, which recognises bodies by their content with `sniff`; no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline_runtime.manifest import TensorRecord

MAX_ELEMENTS = 50_000_000  # refuse absurd shapes before allocating them
MAX_JSON_DEPTH = 64  # deeper nesting than any tensor needs is an attack
MAX_IMAGE_PIXELS = 4096 * 4096
# The decoded input tensors of one request, all inputs together, checked against
# what a .npy/.npz header declares before anything is read. A 4 MiB body (the
# default max_request_size) of JSON or raw .npy decodes to at most 16 MB; only a
# compressed .npz can claim more, and a 300 KB one of zeros claimed 312 MB.
MAX_INPUT_BYTES = 64 * 2**20
# Samples (the batch axis) one request may carry, by default this many times the
# archive's TorchServe batch size: one request then costs at most as much as this
# many full dynamic batches, and cannot hold the worker for long while other
# clients wait (a 30 KB .npz of zeros held 10,000 digits images).
SAMPLES_PER_BATCH = 32
MAX_SAMPLES_ENV = "PIPELINE_MAX_SAMPLES"  # overrides the default for every model of a server


# An input's name, shape (a str is a named dynamic axis) and dtype: the manifest's own record.
InputSpec = TensorRecord


class RequestError(Exception):
    """A request that cannot be served; becomes a 4xx JSON answer."""

    def __init__(self, message: str, status: int = 400, expected: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.expected = expected

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.status, "error": str(self)}
        if self.expected is not None:
            body["expected"] = self.expected
        return body


@dataclass(frozen=True)
class Limits:
    """How much one request may ask of the worker; checked before arrays are allocated."""

    max_samples: int | None = None  # along the batch axis; None: no limit
    max_bytes: int = MAX_INPUT_BYTES  # every input tensor together, as decoded
    # The largest size a named axis other than the batch takes in the artifact served (a
    # .pt2's `bounded_axes`, pipeline_runtime.bounded.axis_bounds): past it the package
    # fails (a 500); refused with a 400 first.
    max_axes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {self.max_samples}")
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {self.max_bytes}")


# What a body is, from its first bytes: the handler decodes by this, whatever the
# Content-Type said, and the gateway tells TorchServe the matching media type.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x93NUMPY", "npy"),
    (b"PK\x03\x04", "npz"),
)
_JSON_START = re.compile(rb"[ \t\r\n]*[\[{]")


def sniff(body: bytes) -> str | None:
    """ "png", "jpeg", "npy", "npz" or "json" (starts like a JSON object or array); else None."""
    for magic, kind in _MAGIC:
        if body.startswith(magic):
            return kind
    return "json" if _JSON_START.match(body) else None


def check_shapes(
    shapes: Mapping[str, tuple[int, ...]],
    specs: Sequence[InputSpec],
    limits: Limits | None = None,
) -> tuple[dict[str, tuple[int, ...]], bool]:
    """Check the inputs' shapes against the contract and the limits, before any data is read.

    → (shapes with the batch axis, unbatched). Inputs sharing a named axis must
    agree on its size (my_cell's x and h both have "batch"): TorchScript would
    broadcast or fail with a 500, and a .pt2 package could read out of bounds.
    """
    unbatched_flags = set()
    out: dict[str, tuple[int, ...]] = {}
    axis_sizes: dict[str, tuple[str, int]] = {}
    for spec in specs:
        shape = sent = tuple(shapes[spec.name])
        size = math.prod(shape)
        if size > MAX_ELEMENTS:
            raise RequestError(
                f"Input {spec.name!r} has {size} values; the limit is {MAX_ELEMENTS}.", status=413
            )
        batch_axis = spec.batch_axis
        if batch_axis is not None and len(shape) == len(spec.shape) - 1:
            shape = (*shape[:batch_axis], 1, *shape[batch_axis:])
            unbatched_flags.add(True)
        elif batch_axis is not None:  # inputs without a batch axis have no say
            unbatched_flags.add(False)
        if (
            len(shape) != len(spec.shape)
            or any(isinstance(d, int) and d != n for d, n in zip(spec.shape, shape, strict=False))
            or any(n < 1 for n in shape)  # a header may declare 0 or negative sizes
        ):
            raise RequestError(_shape_error(spec, sent, shape), expected=spec.describe())
        for dim, n in zip(spec.shape, shape, strict=True):
            if isinstance(dim, str):
                first, seen = axis_sizes.setdefault(dim, (spec.name, n))
                if seen != n:
                    raise RequestError(
                        f"Inputs {first!r} and {spec.name!r} share the axis {dim!r} and must "
                        f"agree on its size; got {seen} and {n}.",
                        expected=[s.describe() for s in specs],
                    )
        out[spec.name] = shape
    if len(unbatched_flags) > 1:
        raise RequestError("Either every input has its batch axis or none does.")
    _check_limits(out, specs, limits or Limits())
    return out, unbatched_flags == {True}


def check_range(a: np.ndarray, spec: InputSpec) -> None:
    """A bounded integer input (token ids, TensorRecord.bounded) within low..high-1, before
    the model runs: past it an embedding's lookup fails the model, wraps round to the last
    row (ONNX's Gather takes -1) or, compiled ahead of time (.pt2), aborts the worker."""
    low, high = int(spec.low or 0), int(spec.high or 0)
    smallest, largest = int(a.min()), int(a.max())
    if smallest < low or largest >= high:
        wrong = smallest if smallest < low else largest
        raise RequestError(
            f"Input {spec.name!r} holds {wrong}; its values must be in {low}..{high - 1} "
            "(the range the export declares, e.g. the vocabulary's token ids).",
            expected=spec.describe() | {"low": low, "high": high},
        )


def _check_limits(
    shapes: Mapping[str, tuple[int, ...]], specs: Sequence[InputSpec], limits: Limits
) -> None:
    samples = max(
        (shapes[s.name][s.batch_axis] for s in specs if s.batch_axis is not None), default=1
    )
    if limits.max_samples is not None and samples > limits.max_samples:
        raise RequestError(
            f"The request holds {samples} samples; this model takes at most {limits.max_samples} "
            "per request. Split it into smaller requests.",
            status=413,
        )
    for spec in specs:
        for dim, n in zip(spec.shape, shapes[spec.name], strict=True):
            bound = limits.max_axes.get(dim) if isinstance(dim, str) else None
            if bound is not None and n > bound:
                raise RequestError(
                    f"Input {spec.name!r} has {n} along {dim!r}; the artifact served takes at "
                    f"most {bound} there (the size it was compiled for): send at most {bound}, "
                    "or serve another format.",
                    expected=spec.describe() | {"max_sizes": {dim: bound}},
                )
    total = sum(math.prod(shapes[s.name]) * _itemsize(s.dtype) for s in specs)
    if total > limits.max_bytes:
        raise RequestError(
            f"The request's inputs take {total} bytes decoded; the limit is {limits.max_bytes}. "
            "Split it into smaller requests.",
            status=413,
        )


def _itemsize(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:  # a dtype numpy has no name for (bfloat16): count it at the widest
        return 8


def _shape_error(spec: Any, sent: tuple[int, ...], read: tuple[int, ...]) -> str:
    """What is wrong with a shape, in the client's terms: the shape as sent (not with the
    batch axis added), which axes may take any size, and an empty axis named as such."""
    free = [d for d in spec.shape if isinstance(d, str)]
    any_size = f" ({', '.join(free)}: any size)" if free else ""
    said = f"Input {spec.name!r} must have shape {list(spec.shape)}{any_size}, got {list(sent)}"
    if read != sent:
        said += f" (read as {list(read)}, with a batch axis of 1)"
    if any(n < 1 for n in sent):
        said += "; every axis needs at least one element"
    return said + "."
