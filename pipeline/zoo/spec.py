"""What the pipeline knows about a model: its inputs, outputs and probes.

A `ZooEntry` is declarative (as Optimum's per-architecture configs are): the
export and verify stages read it and never special-case a model by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import InputSpecError
from pipeline_runtime.manifest import TensorRecord

# One set of named input tensors, in the order the model's forward takes them.
Inputs = dict[str, torch.Tensor]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> "float32" (the spelling manifests use)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise InputSpecError(
            f"Unknown dtype {name!r}. Use one of: {', '.join(sorted(_DTYPES))}."
        ) from None


@dataclass(frozen=True)
class TensorSpec:
    """One input tensor. A `str` in `shape` names a dynamic axis (e.g. "batch")."""

    name: str
    shape: tuple[int | str, ...]
    dtype: torch.dtype = torch.float32
    # The range random values are drawn from, as torch.rand/torch.randint draw
    # them: floats uniform in [low, high), integers low..high-1 (high exclusive,
    # so an embedding of 50 words is declared 0:50).
    low: float = 0.0
    high: float = 1.0
    # An integer input whose values must lie in low..high-1 (token ids): the servers
    # refuse a request past it (pipeline_runtime.manifest.TensorRecord.bounded).
    bounded: bool = False

    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    def concrete_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        try:
            return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)
        except KeyError as err:
            raise InputSpecError(
                f"Input {self.name!r} has dynamic axis {err.args[0]!r} but no size was given for it."
            ) from None

    def sample(self, sizes: Mapping[str, int], generator: torch.Generator) -> torch.Tensor:
        shape = self.concrete_shape(sizes)
        if self.dtype.is_floating_point:
            x = torch.rand(shape, generator=generator, dtype=torch.float32)
            return (self.low + (self.high - self.low) * x).to(self.dtype)
        return torch.randint(int(self.low), int(self.high), shape, generator=generator).to(
            self.dtype
        )

    def check(self, tensor: torch.Tensor) -> None:
        """Raise `InputSpecError` naming what is wrong when `tensor` does not fit."""
        if tensor.dtype != self.dtype:
            raise InputSpecError(
                f"Input {self.name!r} must be {dtype_name(self.dtype)}, got {dtype_name(tensor.dtype)}."
            )
        if tensor.ndim != len(self.shape) or any(
            isinstance(d, int) and d != n for d, n in zip(self.shape, tensor.shape, strict=True)
        ):
            raise InputSpecError(
                f"Input {self.name!r} must have shape {self.describe_shape()}, "
                f"got {tuple(tensor.shape)}."
            )

    def describe_shape(self) -> str:
        return "(" + ", ".join(str(d) for d in self.shape) + ")"

    def record(self) -> TensorRecord:
        """This input as the manifest records it."""
        return TensorRecord(
            self.name, self.shape, dtype_name(self.dtype), self.low, self.high, self.bounded
        )

    def to_json(self) -> dict[str, Any]:
        return self.record().to_json()


@dataclass(frozen=True)
class ZooEntry:
    """A model the pipeline can train, export and verify by name."""

    name: str
    description: str
    builder: Callable[..., nn.Module]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]
    task: str | None  # key into pipeline.train.tasks; None: nothing to train
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    # Sizes of the dynamic axes for golden and random inputs.
    default_sizes: Mapping[str, int] = field(default_factory=lambda: {"batch": 4})
    # Real-data golden inputs, if the model has data; else random ones are drawn.
    golden: Callable[[], Inputs] | None = None
    # Inputs chosen to drive every branch of the model's control flow. Given
    # the (eval-mode) model so they can aim at its learned gate.
    probes: Callable[[torch.Generator, nn.Module], Sequence[tuple[str, Inputs]]] | None = None
    source: str = "zoo"  # "zoo", "torchvision" or "user"
    # Per-model training defaults (epochs, lr, batch_size) that the CLI's own
    # defaults fall back to.
    train_defaults: Mapping[str, Any] = field(default_factory=dict)
    # What serving needs beyond tensors: {"image": {"size": 28}} when PNG/JPEG
    # requests are accepted, {"topk": k} for classifiers.
    serving: Mapping[str, Any] = field(default_factory=dict)
    # For models with data-dependent control flow: the model → an equivalent
    # module written with torch.cond (and scan), for torch.export-based
    # exporters (.pt2, the default ONNX exporter). Same weights, same outputs.
    cond_formulation: Callable[[nn.Module], nn.Module] | None = None
    # What --random-init does after calibrating normalisation statistics, given the golden
    # inputs; returns a note for the manifest (a detector's scores spread, zoo/detection.py).
    after_random_init: Callable[[nn.Module, Inputs], str] | None = None

    def build(self, **overrides: Any) -> nn.Module:
        kwargs = {**self.kwargs, **overrides}
        try:
            return self.builder(**kwargs)
        except TypeError as err:
            raise InputSpecError(
                f"Cannot construct {self.name!r} with arguments {kwargs}: {err}. "
                "Check --model-kwargs against the class's __init__."
            ) from None

    def sample_inputs(self, sizes: Mapping[str, int], generator: torch.Generator) -> Inputs:
        return {spec.name: spec.sample(sizes, generator) for spec in self.inputs}

    def sizes(self, **overrides: int) -> dict[str, int]:
        return {**self.default_sizes, **overrides}

    def golden_inputs(self, generator: torch.Generator) -> Inputs:
        if self.golden is not None:
            return self.golden()
        return self.sample_inputs(self.sizes(), generator)

    def probe_inputs(
        self, generator: torch.Generator, model: nn.Module
    ) -> list[tuple[str, Inputs]]:
        return list(self.probes(generator, model)) if self.probes is not None else []

    def fits(self, inputs: Mapping[str, torch.Tensor], sizes: Mapping[str, int]) -> bool:
        """Whether every dynamic axis named in `sizes` has that size in `inputs`."""
        return all(
            int(inputs[spec.name].shape[axis]) == sizes[name]
            for spec in self.inputs
            for axis, name in spec.dynamic_axes().items()
            if name in sizes and spec.name in inputs
        )

    def within(self, inputs: Mapping[str, torch.Tensor], largest: Mapping[str, int]) -> bool:
        """Whether no dynamic axis named in `largest` is longer than that in `inputs` (an
        ExecuTorch program's planned sizes)."""
        return all(
            int(inputs[spec.name].shape[axis]) <= largest[name]
            for spec in self.inputs
            for axis, name in spec.dynamic_axes().items()
            if name in largest and spec.name in inputs
        )

    def check_inputs(self, inputs: Mapping[str, torch.Tensor]) -> None:
        expected = [s.name for s in self.inputs]
        if list(inputs) != expected:
            raise InputSpecError(
                f"Model {self.name!r} takes inputs {expected}, got {list(inputs)}."
            )
        for spec in self.inputs:
            spec.check(inputs[spec.name])
