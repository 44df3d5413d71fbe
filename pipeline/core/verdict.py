"""One task-level verdict: the metric, its bound, and whether it held (pipeline/export/quality.py).

A verdict is what the parity table, the manifest's `quality` record and the
choice of what to serve read. `held()` decides it: pass, past its bound, or
vacuous when the bound could not have failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.core.budget import DEFAULT_ACCURACY_BUDGET
from pipeline.core.compare import Comparison, Kind

ACCURACY, AGREEMENT, SQNR = "accuracy", "agreement", "sqnr"


@dataclass(frozen=True)
class Verdict:
    """One task-level check: the metric, its bound, and whether it held."""

    rule: str  # ACCURACY, AGREEMENT or SQNR
    output: str
    value: float  # points dropped (accuracy, agreement) or dB (sqnr)
    bound: float
    kind: Kind
    samples: int
    on: str  # what it was measured on, in words
    agreement: float | None = None  # top-1 agreement with eager, 0..1
    sqnr_db: float | None = None
    eager_accuracy: float | None = None  # 0..1 (accuracy rule)
    accuracy: float | None = None
    max_abs: float = 0.0
    problem: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.kind is Kind.PASS

    @property
    def metric(self) -> str:
        return {ACCURACY: "accuracy drop", AGREEMENT: "top-1 disagreement", SQNR: "SQNR"}[self.rule]

    @property
    def decided_by(self) -> str:
        return "min SQNR" if self.rule == SQNR else "accuracy budget"

    @property
    def inputs_label(self) -> str:
        where = "validation split" if self.rule == ACCURACY else "golden+probe+random"
        unit = "values" if self.rule == SQNR else "samples"
        return f"{where} ({self.samples} {unit})" if self.samples else where

    @property
    def unit(self) -> str:
        return "dB" if self.rule == SQNR else "pts"

    def bound_text(self) -> str:
        op = ("≥" if self.value >= self.bound else "<") if self.rule == SQNR else None
        if op is None:
            op = "≤" if self.value <= self.bound else ">"
        return f"{self.metric} {_num(self.value)} {op} {_num(self.bound)} {self.unit}"

    def margin_text(self) -> str:
        if self.kind is Kind.VACUOUS:
            return "vacuous"
        if not math.isfinite(self.value):
            return "∞ left" if self.passed else "∞ over"
        room = self.value - self.bound if self.rule == SQNR else self.bound - self.value
        return f"{abs(room):.2f} {self.unit} {'left' if room >= 0 else 'over'}"

    def describe(self) -> str:
        text = self.problem or f"{self.bound_text()} ({self.margin_text()})"
        return f"{text}; {self.detail()}"

    def detail(self) -> str:
        parts = []
        if self.eager_accuracy is not None and self.accuracy is not None:
            parts.append(f"accuracy {self.eager_accuracy:.2%} eager → {self.accuracy:.2%}")
        if self.agreement is not None:
            parts.append(f"top-1 agreement {self.agreement:.2%}")
        if self.sqnr_db is not None and self.rule != SQNR:
            parts.append(f"SQNR {_num(self.sqnr_db)} dB")
        parts.append(f"on {self.on}")
        return ", ".join(parts)

    def comparison(self) -> Comparison:
        """The verdict as the parity report's Comparison (kind, top-1, the worst |error|)."""
        return Comparison(
            self.max_abs,
            0.0,
            self.passed,
            "" if self.passed else (self.problem or f"{self.bound_text()}; {self.detail()}"),
            self.kind,
            top1=self.agreement,
            vacuous=self.kind is Kind.VACUOUS,
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "rule": self.rule,
            "metric": self.metric,
            "output": self.output,
            "value": finite(self.value),
            "bound": self.bound,
            "unit": self.unit,
            "passed": self.passed,
            "kind": str(self.kind),
            "samples": self.samples,
            "on": self.on,
            "agreement": self.agreement,
            "sqnr_db": finite(self.sqnr_db),
            "max_abs": finite(self.max_abs),
        }
        if self.eager_accuracy is not None:
            out["eager_accuracy"] = self.eager_accuracy
            out["accuracy"] = self.accuracy
        if self.problem:
            out["problem"] = self.problem
        return out | self.extra


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2f}"


def finite(x: float | None) -> float | str | None:
    # JSON has no Infinity (as pipeline.core.compare.json_number writes it).
    return "inf" if x is not None and math.isinf(x) else x


def held(v: Verdict, chance_points: float | None = None) -> Verdict:
    """`v` with its kind decided: pass, over its bound (TOLERANCE), or vacuous."""
    if v.rule == SQNR:
        if v.bound <= 0:
            why = (
                f"vacuous: a minimum SQNR of {v.bound:g} dB is met by an output of all zeros "
                "(0 dB), so the check cannot fail. Use a positive --min-sqnr, e.g. 20"
            )
            return replace(v, kind=Kind.VACUOUS, problem=why)
        ok = v.value >= v.bound
    else:
        if chance_points is not None and v.bound >= chance_points:
            what = "accuracy" if v.rule == ACCURACY else "agreement"
            why = (
                f"vacuous: an accuracy budget of {v.bound:g} pts is met by a model whose "
                f"{what} is at chance (a drop of {chance_points:.1f} pts), so the check cannot "
                f"fail. Use a smaller --accuracy-budget, e.g. {DEFAULT_ACCURACY_BUDGET}"
            )
            return replace(v, kind=Kind.VACUOUS, problem=why)
        ok = v.value <= v.bound
    return replace(v, kind=Kind.PASS if ok else Kind.TOLERANCE)


def broken(rule: str, name: str, bound: float, kind: Kind, why: str) -> Verdict:
    return Verdict(rule, name, math.nan, bound, kind, 0, "", problem=why)
