"""Task-level verdicts (pipeline/core/tasklevel.py, pipeline/core/verdict.py) on hand-made outputs: each bound passes,
fails past it, and refuses to pass when it could not fail (vacuous)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.core import tasklevel as task
from pipeline.core import verdict
from pipeline.core.budget import Budget
from pipeline.core.compare import Kind
from pipeline.core.errors import PipelineError

NAMES = ["y"]


def _cases(n: int, shape: tuple[int, ...], seed: int = 0) -> list[tuple[str, dict]]:
    gen = torch.Generator().manual_seed(seed)
    return [(f"case {i}", {"x": torch.randn(*shape, generator=gen)}) for i in range(n)]


def _eager(inputs: dict) -> dict:
    return {"y": inputs["x"] * 3.0}


def _noisy(snr_db: float):
    """A backend whose error has exactly 1/10^(snr/10) of the reference's power."""

    def run(inputs: dict) -> dict:
        ref = _eager(inputs)["y"]
        noise = torch.ones_like(ref).mul(ref.pow(2).mean().sqrt())
        return {"y": ref + noise * 10 ** (-snr_db / 20)}

    return run


def test_sqnr_of_known_noise_equal_and_zero_outputs() -> None:
    ref = torch.tensor([1.0, -1.0, 1.0, -1.0])
    assert task.sqnr_db(ref, ref) == math.inf
    assert task.sqnr_db(ref, torch.zeros(4)) == pytest.approx(0.0)
    assert task.sqnr_db(ref, ref * 1.1) == pytest.approx(20.0)


@pytest.mark.parametrize(("snr", "bound", "kind"), [(30, 20, Kind.PASS), (30, 40, Kind.TOLERANCE)])
def test_the_sqnr_rule_passes_and_fails_on_its_bound(snr: float, bound: float, kind: Kind) -> None:
    (v,) = task.judge_cases(
        verdict.SQNR,
        _eager,
        _noisy(snr),
        _cases(3, (4, 5)),
        NAMES,
        "int8",
        Budget(min_sqnr_db=bound),
    )
    assert v.kind is kind and v.value == pytest.approx(snr, abs=0.01)
    assert ("left" if kind is Kind.PASS else "over") in v.margin_text()
    assert v.bound_text().startswith("SQNR 30.00 ")


def test_a_min_sqnr_that_zeros_would_meet_is_vacuous() -> None:
    zeros = lambda inputs: {"y": torch.zeros(4, 5)}  # noqa: E731
    (v,) = task.judge_cases(
        verdict.SQNR, _eager, zeros, _cases(2, (4, 5)), NAMES, "int8", Budget(min_sqnr_db=0.0)
    )
    assert v.kind is Kind.VACUOUS and "all zeros" in v.problem
    assert not v.comparison().passed


def test_the_precision_default_sqnr_floor_applies_when_none_is_given() -> None:
    (v,) = task.judge_cases(verdict.SQNR, _eager, _noisy(30), _cases(2, (4, 5)), NAMES, "float16",
                            Budget())  # fmt: skip
    assert v.bound == 40.0 and v.kind is Kind.TOLERANCE


def _flip_first(inputs: dict) -> dict:
    """A classifier backend whose first sample's top-1 moves to another class."""
    y = _eager(inputs)["y"].clone()
    y[0] = -y[0]
    return {"y": y}


def test_agreement_counts_flips_in_points_against_the_budget() -> None:
    cases = _cases(4, (5, 10))  # 20 samples: one flip is 5 points
    v, _ = task.judge_cases(verdict.AGREEMENT, _eager, _flip_first, cases, NAMES, "int8", Budget())
    assert v.rule == verdict.AGREEMENT and v.samples == 20
    assert v.agreement == pytest.approx(0.8) and v.value == pytest.approx(20.0)
    assert v.kind is Kind.TOLERANCE and "one disagreement is 5.00 pts" in v.on
    ok, scores = task.judge_cases(verdict.AGREEMENT, _eager, _eager, cases, NAMES, "int8", Budget())
    assert ok.passed and ok.agreement == 1.0 and scores.passed


def test_an_agreement_budget_that_chance_would_meet_is_vacuous() -> None:
    v, _ = task.judge_cases(verdict.AGREEMENT, _eager, _eager, _cases(2, (5, 10)), NAMES, "int8",
                            Budget(accuracy_points=95.0))  # fmt: skip
    assert v.kind is Kind.VACUOUS and "chance" in v.problem


def test_accuracy_drop_in_points_on_labelled_batches() -> None:
    x = torch.eye(4).repeat(2, 1)  # 8 samples, classes 0..3 twice
    labels = torch.arange(4).repeat(2)
    batches = [({"x": x[:4]}, labels[:4]), ({"x": x[4:]}, labels[4:])]
    v, _ = task.judge_accuracy(
        _eager, _flip_first, batches, NAMES, Budget(accuracy_points=10.0), "int8"
    )
    # Eager is right on all 8; the backend is wrong on the first of each batch: 25 points.
    assert (v.eager_accuracy, v.accuracy) == (1.0, 0.75)
    assert v.value == pytest.approx(25.0) and v.kind is Kind.TOLERANCE
    assert "accuracy 100.00% eager → 75.00%" in v.describe()
    v, _ = task.judge_accuracy(
        _eager, _flip_first, batches, NAMES, Budget(accuracy_points=80.0), "int8"
    )
    assert v.kind is Kind.VACUOUS  # 75 points would leave it at chance (25%) and still pass


def _scaled_scores(inputs: dict) -> dict:
    """Every top-1 answer kept, every score ×4: a layer's quantisation scale gone wrong."""
    return {"y": _eager(inputs)["y"] * 4.0}


def test_right_decisions_with_far_off_scores_fail_the_score_bound() -> None:
    x = torch.eye(4).repeat(2, 1)
    labels = torch.arange(4).repeat(2)
    batches = [({"x": x[:4]}, labels[:4]), ({"x": x[4:]}, labels[4:])]
    drop, scores = task.judge_accuracy(_eager, _scaled_scores, batches, NAMES, Budget(), "int8")
    assert drop.passed and drop.value == 0.0  # the accuracy rule alone would pass it
    # (3y − 12y)² is 9× the signal: SQNR −9.5 dB, below the int8 floor of 20 dB.
    assert scores.rule == verdict.SQNR and scores.bound == 20.0
    assert scores.kind is Kind.TOLERANCE and scores.value == pytest.approx(-9.54, abs=0.01)
    assert "the score bound" in scores.on and scores.agreement == 1.0
    record = task.quality_record([drop, scores], Budget(), "int8")
    assert record["rule"] == verdict.SQNR and not record["within_budget"]  # the rule that decided
    cases = _cases(3, (5, 10))
    agree, scores = task.judge_cases(
        verdict.AGREEMENT, _eager, _scaled_scores, cases, NAMES, "float16", Budget()
    )
    assert agree.passed and scores.bound == 40.0 and not scores.passed


def test_a_classifier_within_both_bounds_records_its_decision_rule() -> None:
    cases = _cases(3, (5, 10))
    verdicts = task.judge_cases(
        verdict.AGREEMENT, _eager, _noisy(45), cases, NAMES, "int8", Budget()
    )
    assert [v.rule for v in verdicts] == [verdict.AGREEMENT, verdict.SQNR]
    assert all(v.passed for v in verdicts)
    record = task.quality_record(verdicts, Budget(), "int8")
    assert record["rule"] == verdict.AGREEMENT and record["within_budget"]
    assert record["sqnr_db"] == pytest.approx(45, abs=0.01)


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ({"y": torch.full((4, 5), float("nan"))}, Kind.NON_FINITE),
        ({"y": torch.zeros(4, 6)}, Kind.SHAPE),
        ({}, Kind.MISSING),
    ],
)
def test_a_broken_answer_fails_with_its_own_kind(answer: dict, kind: Kind) -> None:
    (v,) = task.judge_cases(verdict.SQNR, _eager, lambda i: answer, _cases(1, (4, 5)), NAMES, "int8",
                            Budget())  # fmt: skip
    assert v.kind is kind and not v.passed and v.problem


@pytest.mark.parametrize("bad", [Budget(accuracy_points=-1), Budget(min_sqnr_db=math.inf)])
def test_a_budget_must_be_finite_and_non_negative(bad: Budget) -> None:
    with pytest.raises(PipelineError, match=r"accuracy-budget|min-sqnr"):
        bad.validate()


def test_the_recorded_budget_is_overridden_only_where_given() -> None:
    recorded = Budget.from_json({"accuracy_points": 1.0, "min_sqnr_db": 25.0})
    assert recorded.override(None, None) == recorded
    assert recorded.override(0.2, None) == Budget(0.2, 25.0)
    assert Budget.from_json(None) == Budget()
