"""Numerical comparison of backend outputs against eager PyTorch.

The pass rule is `torch.allclose`'s: |actual - expected| <= atol + rtol * |expected|
elementwise, with NaN equal only to NaN in the same place.

Verify asks for two stricter rules (`strict=True`), because a check that
cannot fail proves nothing:

- **non-finite**: NaN or Inf in a backend's output (or in the reference) is a
  failure of its own kind, even where both sides agree;
- **vacuous**: when the tolerance at the reference's largest magnitude,
  atol + rtol * max|ref|, is at least `VACUOUS_FRACTION` of that magnitude,
  an output of zeros (or anything within that band) would pass too. Such a
  check is not a pass unless the caller accepts it.

Besides pass/fail a `Comparison` carries what a person needs to judge the
numbers: max abs/rel error, the 99th percentile of the abs error, the
reference's scale (max |ref| and standard deviation), the smallest atol (at
the given rtol) and rtol (at the given atol) that would have passed, top-1
agreement for classifier outputs, and a histogram of |error| by decade.

It also names the element that decided the check: the one whose error uses
the largest fraction of its own allowance atol + rtol * |ref|. A relative
error above rtol alone says little (atol may cover it); that element shows
which term decided, and how much room was left or how far past it went.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import torch

from pipeline.core.defaults import DEFAULT_ATOL, DEFAULT_RTOL
from pipeline.core.errors import (
    BackendCrashError,
    MissingOutputError,
    NonFiniteOutputError,
    ParityError,
    ShapeMismatchError,
    ToleranceError,
    VacuousToleranceError,
)
from pipeline_runtime.outputs import flatten_outputs

# A tolerance that, at the reference's largest magnitude, allows a tenth of
# that magnitude cannot tell the reference from a clearly wrong answer.
VACUOUS_FRACTION = 0.1
# The |error| histogram's bins: exact zero, then one per decade from 1e-12 to
# 1e+3 (values below 1e-12 fall in the first decade, above 1e3 in the last).
HIST_DECADES = tuple(range(-12, 4))

__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "HIST_DECADES",
    "VACUOUS_FRACTION",
    "Comparison",
    "Kind",
    "compare_outputs",
    "compare_tensor",
    "flatten_outputs",
]


class Kind(StrEnum):
    """What a comparison found; each failing kind has its own exception class."""

    PASS = "pass"
    TOLERANCE = "tolerance"
    SHAPE = "shape"  # shape or dtype differs
    NON_FINITE = "non-finite"
    VACUOUS = "vacuous"
    MISSING = "missing output"
    CRASHED = "crashed"

    @property
    def error(self) -> type[ParityError]:
        return {
            Kind.TOLERANCE: ToleranceError,
            Kind.SHAPE: ShapeMismatchError,
            Kind.NON_FINITE: NonFiniteOutputError,
            Kind.VACUOUS: VacuousToleranceError,
            Kind.MISSING: MissingOutputError,
            Kind.CRASHED: BackendCrashError,
        }.get(self, ParityError)


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float
    passed: bool
    problem: str = ""  # why it failed, in words; empty for a pass
    kind: Kind = Kind.PASS
    p99_abs: float = 0.0
    ref_max: float = 0.0  # max |expected|
    ref_std: float = 0.0
    min_atol: float = 0.0  # smallest atol that passes at the given rtol
    min_rtol: float = 0.0  # smallest rtol that passes at the given atol (inf: never)
    top1: float | None = None  # classifiers: fraction of rows whose argmax agrees
    hist: tuple[int, ...] = ()  # |error| counts: [== 0, then one per HIST_DECADES decade]
    # The element closest to (or furthest past) its bound, the largest |err| / (atol + rtol*|ref|):
    # the max errors alone cannot say whether atol or rtol decided. None: not measured.
    bound_err: float | None = None  # |err| there
    bound_ref: float | None = None  # |ref| there
    bound_allowed: float | None = None  # atol + rtol * |ref| there
    bound_used: float | None = None  # bound_err / bound_allowed: <= 1 passes (inf: no allowance)
    # The tolerance cannot tell the reference from zeros (see vacuous_problem), accepted or not:
    # such a pass must not read as a margin.
    vacuous: bool = False

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = str(self.kind)
        out["hist"] = list(self.hist)
        return {k: json_number(v) for k, v in out.items()}

    @classmethod
    def failed(cls, kind: Kind, problem: str) -> Comparison:
        """A comparison that never got to the values (shape, missing, crashed)."""
        inf = float("inf")
        return cls(inf, inf, False, problem, kind, inf, 0.0, 0.0, inf, inf)

    def error(self, where: str) -> ParityError | None:
        """The typed exception for this failure (None for a pass), naming `where`."""
        if self.passed:
            return None
        return self.kind.error(f"{where}: {self.problem}")


def json_number(value: Any) -> Any:
    # JSON has no Infinity: the reports write "inf" instead.
    return "inf" if isinstance(value, float) and math.isinf(value) else value


def _histogram(diff: torch.Tensor) -> tuple[int, ...]:
    flat = diff.flatten()
    zero = int((flat == 0).sum())
    nonzero = flat[flat > 0]
    if nonzero.numel() == 0:
        return (zero, *([0] * len(HIST_DECADES)))
    decade = nonzero.log10().floor().clamp(HIST_DECADES[0], HIST_DECADES[-1]) - HIST_DECADES[0]
    counts = torch.bincount(decade.long(), minlength=len(HIST_DECADES))
    return (zero, *(int(c) for c in counts))


def _percentile(values: torch.Tensor, q: float) -> float:
    flat = values.flatten()
    k = max(1, math.ceil(q * flat.numel()))
    return float(flat.kthvalue(k).values)  # kthvalue: no size limit, unlike torch.quantile


def _top1(expected: torch.Tensor, actual: torch.Tensor) -> float | None:
    if expected.dim() != 2 or expected.shape[1] < 2 or not expected.is_floating_point():
        return None
    return float((expected.argmax(1) == actual.argmax(1)).double().mean())


def compare_tensor(
    expected: torch.Tensor,
    actual: torch.Tensor,
    atol: float,
    rtol: float,
    *,
    strict: bool = False,
    allow_vacuous: bool = False,
    classifier: bool = False,
    detail: bool = True,
) -> Comparison:
    """Compare one output with its reference.

    `strict`: verify's rules (non-finite values and vacuous tolerances fail;
    see the module docstring); `allow_vacuous` accepts a vacuous tolerance
    anyway. `classifier`: also measure top-1 agreement of a [batch, classes] output.
    `detail=False` skips the report statistics (percentile, histogram, smallest
    passing tolerances): pass/fail checks on many or large tensors do not need them.
    """
    expected = expected.detach().cpu()
    actual = actual.detach().cpu()
    if tuple(expected.shape) != tuple(actual.shape):
        return Comparison.failed(
            Kind.SHAPE, f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        )
    if expected.dtype != actual.dtype:
        return Comparison.failed(Kind.SHAPE, f"dtype {actual.dtype} != expected {expected.dtype}")
    if expected.numel() == 0:
        return Comparison(0.0, 0.0, True, hist=(0, *([0] * len(HIST_DECADES))))
    exp = expected.double()
    act = actual.double()
    nan_mismatch = bool((exp.isnan() != act.isnan()).any())
    diff = (act - exp).abs()
    # Inf - Inf is NaN: equal infinities are no error, anything else non-finite is an infinite one.
    same = (exp == act) | (exp.isnan() & act.isnan())
    diff = torch.where(same, torch.zeros_like(diff), diff.nan_to_num(nan=float("inf")))
    scale = exp.abs().nan_to_num(nan=0.0, posinf=0.0)
    max_abs = float(diff.max())
    # Relative error is only meaningful where the reference is not ~0.
    rel = torch.where(scale > atol, diff / scale.clamp_min(atol), torch.zeros_like(diff))
    max_rel = float(rel.max())
    finite_ref = exp[exp.isfinite()]
    ref_max = float(finite_ref.abs().max()) if finite_ref.numel() else 0.0
    # Every dtype, as the strict rule below has always applied it (exp is float64 whatever
    # the output's dtype). The flag is kept when accepted, so reports never show it as a margin.
    vacuous = bool(vacuous_problem(ref_max, atol, rtol))
    stats: dict[str, Any] = {"ref_max": ref_max, "vacuous": vacuous}
    if detail:
        stats.update(_statistics(exp, act, diff, scale, finite_ref, atol, rtol, classifier))
        stats.update(_bound(diff, scale, atol, rtol))
    passed = not nan_mismatch and torch.allclose(act, exp, atol=atol, rtol=rtol, equal_nan=True)
    if nan_mismatch:
        return Comparison(
            max_abs, max_rel, False, "NaN in different places", Kind.NON_FINITE, **stats
        )
    if not passed and bool((~act.isfinite() & exp.isfinite()).any()):
        return Comparison(
            max_abs,
            max_rel,
            False,
            "NaN/Inf where the reference is finite",
            Kind.NON_FINITE,
            **stats,
        )
    if strict:
        bad = int((~act.isfinite()).sum())
        if bad:
            return Comparison(
                max_abs,
                max_rel,
                False,
                f"{bad} NaN/Inf value(s) in the output",
                Kind.NON_FINITE,
                **stats,
            )
        if not bool(exp.isfinite().all()):
            return Comparison(
                max_abs,
                max_rel,
                False,
                "the eager reference itself holds NaN/Inf: there is nothing to compare",
                Kind.NON_FINITE,
                **stats,
            )
    if not passed:
        problem = f"max abs err {max_abs:.3g}, max rel err {max_rel:.3g}"
        if detail:
            problem += (
                f"; would pass with atol {stats['min_atol']:.3g} or rtol {stats['min_rtol']:.3g}"
            )
        return Comparison(max_abs, max_rel, False, problem, Kind.TOLERANCE, **stats)
    if strict and not allow_vacuous and vacuous:
        problem = vacuous_problem(ref_max, atol, rtol)
        if problem:
            return Comparison(max_abs, max_rel, False, problem, Kind.VACUOUS, **stats)
    return Comparison(max_abs, max_rel, True, **stats)


def _statistics(
    exp: torch.Tensor,
    act: torch.Tensor,
    diff: torch.Tensor,
    scale: torch.Tensor,
    finite_ref: torch.Tensor,
    atol: float,
    rtol: float,
    classifier: bool,
) -> dict[str, Any]:
    """What a person reads beside pass/fail: spread, percentile, passing tolerances, top-1."""
    if bool(((diff > atol) & (scale == 0)).any()):
        min_rtol = float("inf")  # an error where the reference is 0: no rtol covers it
    else:
        min_rtol = float(((diff - atol).clamp_min(0) / scale.clamp_min(1e-300)).max())
    return {
        "p99_abs": _percentile(diff, 0.99),
        "ref_std": float(finite_ref.std()) if finite_ref.numel() > 1 else 0.0,
        "min_atol": float((diff - rtol * scale).clamp_min(0).max()),
        "min_rtol": min_rtol,
        "top1": _top1(exp, act) if classifier else None,
        "hist": _histogram(diff),
    }


def _bound(diff: torch.Tensor, scale: torch.Tensor, atol: float, rtol: float) -> dict[str, float]:
    """The element whose |err| uses the largest fraction of its allowance atol + rtol*|ref|."""
    allowed = atol + rtol * scale
    # An error where the allowance is 0 uses infinitely much of it; no error uses none.
    used = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed).flatten()
    # Ties (all exact, or several errors with no allowance): the largest error among them.
    tied = torch.where(used == used.max(), diff.flatten(), torch.full_like(used, -1.0))
    i = int(tied.argmax())
    return {
        "bound_err": float(diff.flatten()[i]),
        "bound_ref": float(scale.flatten()[i]),
        "bound_allowed": float(allowed.flatten()[i]),
        "bound_used": float(used[i]),
    }


def vacuous_problem(ref_max: float, atol: float, rtol: float) -> str:
    """Why a tolerance cannot tell a reference of largest magnitude `ref_max` from
    zeros, or "" when it can. A reference of exact zeros is not vacuous: zeros are right."""
    if ref_max == 0:
        return ""
    allowed = atol + rtol * ref_max
    if allowed < VACUOUS_FRACTION * ref_max:
        return ""
    return (
        f"vacuous: the tolerance ({allowed:.3g} at the largest value) is at least "
        f"{VACUOUS_FRACTION:g} of the reference's largest magnitude {ref_max:.3g}, so all zeros "
        f"would pass too. Use a smaller --atol (or --atol-scale, a tolerance relative to the "
        f"output's scale), weights/inputs of realistic scale, or --allow-vacuous to accept it"
    )


def compare_outputs(
    expected: Sequence[torch.Tensor],
    actual: Sequence[torch.Tensor],
    atol: float,
    rtol: float,
    names: Sequence[str] = (),
) -> str | None:
    """None when every output matches, else a short description of the first mismatch,
    naming the output (by `names`, else "number 4 of 5": "output 3" was read as the third
    counted from 1, and was the fourth)."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        c = compare_tensor(e, a, atol, rtol, detail=False)
        if not c.passed:
            which = repr(names[i]) if i < len(names) else f"number {i + 1} of {len(expected)}"
            return f"output {which}: {c.problem or f'max abs err {c.max_abs:.3g}'}"
    return None
