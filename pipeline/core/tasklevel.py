"""Task-level judging: how far a reduced-precision backend's answers are from eager's.

The rules themselves (which one judges a model, and why) are described in
pipeline/export/quality.py and docs/verification.md; this module holds the
arithmetic they share, on answers already computed: SQNR, top-1 agreement,
the accuracy drop on labelled batches, and the manifest's `quality` record.

A classifier is held to two bounds: its decisions (the accuracy drop, or top-1
disagreement) and its scores (the SQNR of the same output over the same samples,
`score_bound`). Decisions alone let an artifact whose scores are far off pass: a
layer's int8 scale ×4 keeps the digits' top-1 answers (97.2%, 99.7% agreement) while
its logits fall to 3.1 dB, and a user who thresholds on the scores gets wrong answers.
Export (measuring an artifact as it is written) and verify (checking it
later, and any served copy of it) call the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.core.budget import Budget
from pipeline.core.compare import Kind
from pipeline.core.verdict import ACCURACY, AGREEMENT, SQNR, Verdict, broken, finite, held

VALIDATION_BATCH = 128  # validation samples per forward pass

Inputs = Mapping[str, torch.Tensor]  # one set of named inputs, in forward() order
# A backend's answer: named tensors, or tensors in manifest order (served backends).
Answer = Mapping[str, torch.Tensor] | Sequence[torch.Tensor]
Run = Callable[[Inputs], Answer]


def _named(answer: Answer, names: Sequence[str]) -> dict[str, torch.Tensor]:
    if isinstance(answer, Mapping):
        return {n: answer[n] for n in names if n in answer}
    return dict(zip(names, answer, strict=False))


@dataclass
class _Pool:
    """Eager's and a backend's outputs over many inputs, per output name."""

    names: Sequence[str]
    pairs: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    broken: dict[str, tuple[Kind, str]] = field(default_factory=dict)  # output → why

    def add(self, label: str, expected: Mapping[str, torch.Tensor], answer: Answer) -> None:
        got = _named(answer, self.names)
        for name in self.names:
            if name in self.broken:
                continue
            ref = expected[name].detach().cpu().double()
            if name not in got:
                self.broken[name] = (Kind.MISSING, "the backend did not return this output")
                continue
            out = got[name].detach().cpu().double()
            if tuple(out.shape) != tuple(ref.shape):
                why = f"shape {tuple(out.shape)} != expected {tuple(ref.shape)} on {label!r}"
                self.broken[name] = (Kind.SHAPE, why)
            elif not bool(out.isfinite().all()):
                self.broken[name] = (Kind.NON_FINITE, f"NaN/Inf in the output on {label!r}")
            else:
                self.pairs.setdefault(name, []).append((ref, out))

    def flat(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Every value of output `name`, eager's and the backend's, as two 1-D tensors."""
        pairs = self.pairs.get(name, [])
        return (
            torch.cat([r.flatten() for r, _ in pairs]) if pairs else torch.zeros(0),
            torch.cat([g.flatten() for _, g in pairs]) if pairs else torch.zeros(0),
        )

    def rows(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """[samples, classes] of a classifier-shaped output over every input; None otherwise."""
        pairs = self.pairs.get(name, [])
        if not pairs or any(r.ndim != 2 or r.shape[1] < 2 for r, _ in pairs):
            return None
        return torch.cat([r for r, _ in pairs]), torch.cat([g for _, g in pairs])


def sqnr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    """10·log10(Σref² / Σ(ref − got)²): inf when they are equal, 0 for all zeros."""
    signal = float(ref.double().pow(2).sum())
    noise = float((ref.double() - got.double()).pow(2).sum())
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf  # an error where the reference is exactly zero
    return 10 * math.log10(signal / noise)


def _agreement(ref: torch.Tensor, got: torch.Tensor) -> float | None:
    if ref.ndim != 2 or ref.shape[1] < 2:
        return None
    return float((ref.argmax(1) == got.argmax(1)).double().mean())


def judge_cases(
    rule: str,
    eager: Run,
    backend: Run,
    cases: Sequence[tuple[str, Inputs]],
    names: Sequence[str],
    precision: str,
    budget: Budget,
) -> list[Verdict]:
    """The agreement or SQNR rule over CASES (golden, probe, random inputs)."""
    pool = _Pool(names)
    for label, inputs in cases:
        pool.add(label, _named(eager(inputs), names), backend(inputs))
    on = f"the golden, probe and random inputs ({len(cases)} sets)"
    verdicts = []
    for name in names if rule == SQNR else names[:1]:
        if name in pool.broken:
            kind, why = pool.broken[name]
            bound = budget.accuracy_points if rule == AGREEMENT else budget.sqnr_for(precision)
            verdicts.append(broken(rule, name, bound, kind, why))
            continue
        ref, got = pool.flat(name)
        sqnr = sqnr_db(ref, got)
        max_abs = float((ref - got).abs().max()) if ref.numel() else 0.0
        # Top-1 agreement only means something for a classifier's output.
        rows = pool.rows(name) if rule == AGREEMENT else None
        agreement = _agreement(*rows) if rows is not None else None
        if rule == AGREEMENT and rows is not None and agreement is not None:
            samples, classes = rows[0].shape
            on_samples = f"{on}: {samples} samples"
            verdicts.append(
                held(
                    Verdict(
                        AGREEMENT,
                        name,
                        (1 - agreement) * 100,
                        budget.accuracy_points,
                        Kind.PASS,
                        samples,
                        f"{on}: {samples} samples, one disagreement is {100 / samples:.2f} pts",
                        agreement=agreement,
                        sqnr_db=sqnr,
                        max_abs=max_abs,
                    ),
                    chance_points=(1 - 1 / classes) * 100,
                )
            )
            verdicts.append(score_bound(name, ref, got, precision, budget, on_samples, agreement))
            continue
        on_values = f"{on}: {ref.numel()} values"
        verdicts.append(sqnr_verdict(name, ref, got, precision, budget, on_values, agreement))
    return verdicts


def sqnr_verdict(
    name: str,
    ref: torch.Tensor,
    got: torch.Tensor,
    precision: str,
    budget: Budget,
    on: str,
    agreement: float | None = None,
) -> Verdict:
    """The SQNR of output `name` (eager's `ref`, the backend's `got`) against the floor."""
    sqnr = sqnr_db(ref, got)
    return held(
        Verdict(
            SQNR,
            name,
            sqnr,
            budget.sqnr_for(precision),
            Kind.PASS,
            int(ref.numel()),
            on,
            agreement=agreement,
            sqnr_db=sqnr,
            max_abs=float((ref - got).abs().max()) if ref.numel() else 0.0,
        )
    )


def score_bound(
    name: str,
    ref: torch.Tensor,
    got: torch.Tensor,
    precision: str,
    budget: Budget,
    on: str,
    agreement: float | None,
) -> Verdict:
    """A classifier's second bound: the SQNR of its scores (`name`, pooled over the samples
    its decisions were judged on) must reach the precision's floor, as a non-classifier's
    outputs must. docs/verification.md ("Scores too") has the measurements behind it."""
    on = f"{on} (the score bound: {ref.numel()} values)"
    return sqnr_verdict(name, ref, got, precision, budget, on, agreement)


def judge_accuracy(
    eager: Run,
    backend: Run,
    batches: Sequence[tuple[Inputs, torch.Tensor]],
    names: Sequence[str],
    budget: Budget,
    precision: str,
) -> list[Verdict]:
    """The accuracy rule: the drop on the validation split, in points; and the score bound
    on the same samples."""
    name = names[0]
    pool = _Pool([name])
    labels = []
    for i, (inputs, target) in enumerate(batches):
        pool.add(f"validation batch {i}", _named(eager(inputs), names), backend(inputs))
        labels.append(target)
    if name in pool.broken:
        kind, why = pool.broken[name]
        return [broken(ACCURACY, name, budget.accuracy_points, kind, why)]
    rows = pool.rows(name)
    if rows is None:
        why = "the first output is not [batch, classes], so accuracy cannot be measured"
        return [broken(ACCURACY, name, budget.accuracy_points, Kind.SHAPE, why)]
    ref, got = rows
    target = torch.cat(labels)
    eager_acc = float((ref.argmax(1) == target).double().mean())
    acc = float((got.argmax(1) == target).double().mean())
    samples = int(target.numel())
    verdict = Verdict(
        ACCURACY,
        name,
        (eager_acc - acc) * 100,
        budget.accuracy_points,
        Kind.PASS,
        samples,
        f"the validation split: {samples} samples, one error is {100 / samples:.2f} pts",
        agreement=_agreement(ref, got),
        sqnr_db=sqnr_db(ref, got),
        eager_accuracy=eager_acc,
        accuracy=acc,
        max_abs=float((ref - got).abs().max()),
    )
    on = f"the validation split: {samples} samples"
    return [
        held(verdict, chance_points=(eager_acc - 1 / ref.shape[1]) * 100),
        score_bound(name, ref, got, precision, budget, on, verdict.agreement),
    ]


def quality_record(verdicts: Sequence[Verdict], budget: Budget, precision: str) -> dict[str, Any]:
    """What the manifest keeps of the verdicts measured at export (the Pareto table's row):
    the worst failing check, else the closest call of the model's first rule (a
    classifier's decisions, whose score bound passed too)."""
    failing = [v for v in verdicts if not v.passed]
    worst = max(failing or [v for v in verdicts if v.rule == verdicts[0].rule], key=_badness)
    sqnrs = [v.sqnr_db for v in verdicts if v.sqnr_db is not None]
    return {
        "rule": worst.rule,
        "metric": worst.metric,
        "value": finite(worst.value),
        "unit": worst.unit,
        "bound": worst.bound,
        "within_budget": all(v.passed for v in verdicts),
        "agreement": worst.agreement,
        "sqnr_db": finite(min(sqnrs)) if sqnrs else None,
        "eager_accuracy": worst.eager_accuracy,
        "accuracy": worst.accuracy,
        "samples": worst.samples,
        "on": worst.on,
        "budget": budget.to_json() | {"min_sqnr_db": budget.sqnr_for(precision)},
        "checks": [v.to_json() for v in verdicts],
    }


def _badness(v: Verdict) -> float:
    """How far past (or how close to) its bound a verdict is: larger is worse."""
    if math.isnan(v.value):
        return math.inf
    return v.bound - v.value if v.rule == SQNR else v.value - v.bound
