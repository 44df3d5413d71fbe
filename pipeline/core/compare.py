"""Numerical comparison of backend outputs against eager PyTorch.

The pass rule is `torch.allclose`'s: |actual - expected| <= atol + rtol * |expected|
elementwise, with NaN equal only to NaN in the same place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from pipeline_runtime.outputs import flatten_outputs

DEFAULT_ATOL = 1e-5  # fp32 on CPU; see issue 2 / DESIGN.md
DEFAULT_RTOL = 1e-4

__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "Comparison",
    "compare_outputs",
    "compare_tensor",
    "flatten_outputs",
]


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float
    passed: bool
    problem: str = ""  # shape/dtype/NaN mismatch, empty when values were compared

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compare_tensor(
    expected: torch.Tensor, actual: torch.Tensor, atol: float, rtol: float
) -> Comparison:
    expected = expected.detach().cpu()
    actual = actual.detach().cpu()
    if tuple(expected.shape) != tuple(actual.shape):
        return Comparison(
            float("inf"),
            float("inf"),
            False,
            f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}",
        )
    if expected.dtype != actual.dtype:
        return Comparison(
            float("inf"), float("inf"), False, f"dtype {actual.dtype} != expected {expected.dtype}"
        )
    if expected.numel() == 0:
        return Comparison(0.0, 0.0, True)
    exp = expected.double()
    act = actual.double()
    nan_mismatch = bool((exp.isnan() != act.isnan()).any())
    diff = (act - exp).abs().nan_to_num(nan=0.0, posinf=float("inf"))
    max_abs = float(diff.max())
    scale = exp.abs()
    # Relative error is only meaningful where the reference is not ~0.
    rel = torch.where(scale > atol, diff / scale.clamp_min(atol), torch.zeros_like(diff))
    max_rel = float(rel.nan_to_num(nan=0.0).max())
    passed = not nan_mismatch and torch.allclose(act, exp, atol=atol, rtol=rtol, equal_nan=True)
    return Comparison(max_abs, max_rel, passed, "NaN in different places" if nan_mismatch else "")


def compare_outputs(
    expected: Sequence[torch.Tensor], actual: Sequence[torch.Tensor], atol: float, rtol: float
) -> str | None:
    """None when every output matches, else a short description of the first mismatch."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        c = compare_tensor(e, a, atol, rtol)
        if not c.passed:
            return f"output {i}: {c.problem or f'max abs err {c.max_abs:.3g}'}"
    return None
