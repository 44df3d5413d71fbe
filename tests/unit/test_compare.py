import math

import pytest
import torch

from pipeline.core.compare import (
    HIST_DECADES,
    VACUOUS_FRACTION,
    Kind,
    compare_outputs,
    compare_tensor,
    flatten_outputs,
)
from pipeline.core.errors import (
    MissingOutputError,
    NonFiniteOutputError,
    ParityError,
    ShapeMismatchError,
    ToleranceError,
    VacuousToleranceError,
)
from pipeline.verify.report import ParityReport, Row


def test_equal_tensors_pass_with_zero_error() -> None:
    x = torch.randn(3, 4)
    c = compare_tensor(x, x.clone(), atol=1e-5, rtol=1e-4)
    assert c.passed and c.max_abs == 0.0 and c.max_rel == 0.0


def test_difference_beyond_tolerance_fails_and_is_measured() -> None:
    x = torch.ones(4)
    y = x.clone()
    y[2] += 1e-3
    c = compare_tensor(x, y, atol=1e-5, rtol=1e-4)
    assert not c.passed
    assert math.isclose(c.max_abs, 1e-3, rel_tol=1e-3)
    assert math.isclose(c.max_rel, 1e-3, rel_tol=1e-3)
    assert compare_tensor(x, y, atol=1e-2, rtol=0).passed


def test_shape_dtype_and_nan_mismatches_fail_with_reason() -> None:
    x = torch.zeros(2, 3)
    assert "shape" in compare_tensor(x, torch.zeros(3, 2), 1e-5, 1e-4).problem
    assert "dtype" in compare_tensor(x, x.double(), 1e-5, 1e-4).problem
    y = x.clone()
    y[0, 0] = float("nan")
    c = compare_tensor(x, y, 1e-5, 1e-4)
    assert not c.passed and "NaN" in c.problem
    # NaN in the same place on both sides is agreement.
    assert compare_tensor(y, y.clone(), 1e-5, 1e-4).passed


def test_flatten_and_compare_outputs() -> None:
    a, b = torch.ones(2), torch.zeros(2)
    assert len(flatten_outputs((a, [b, {"k": a}]))) == 3
    assert compare_outputs([a, b], [a, b], 1e-5, 1e-4) is None
    assert compare_outputs([a, b], [a], 1e-5, 1e-4) == "1 outputs, expected 2"
    # Which output, counted from 1 with the count (a user read "output 3", 0-based, as the
    # third), or by name when the caller has the names.
    assert "output number 2 of 2:" in compare_outputs([a, b], [a, b + 1], 1e-5, 1e-4)
    assert "output 'y':" in compare_outputs([a, b], [a, b + 1], 1e-5, 1e-4, ("x", "y"))


# --- verify's strict rules (issue 16): a check must be able to fail ----------------------


def test_a_tolerance_that_cannot_tell_the_reference_from_zeros_is_not_a_pass() -> None:
    ref = torch.randn(4, 10, generator=torch.Generator().manual_seed(0)) * 2e-9
    zeros = torch.zeros_like(ref)
    plain = compare_tensor(ref, zeros, atol=1e-5, rtol=1e-4)
    assert plain.passed  # allclose alone is fooled: this is what the strict rule is for
    strict = compare_tensor(ref, zeros, atol=1e-5, rtol=1e-4, strict=True)
    assert not strict.passed and strict.kind is Kind.VACUOUS
    assert "zeros would pass" in strict.problem and "--atol-scale" in strict.problem
    assert isinstance(strict.error("onnxruntime / golden / logits"), VacuousToleranceError)
    # The same numbers at realistic scale: the tolerance discriminates, the check passes.
    assert compare_tensor(ref * 1e9, ref * 1e9, 1e-5, 1e-4, strict=True).passed
    # Accepted explicitly: a pass.
    assert compare_tensor(ref, zeros, 1e-5, 1e-4, strict=True, allow_vacuous=True).passed


def test_the_vacuous_threshold_is_the_stated_fraction_of_the_largest_reference_value() -> None:
    ref = torch.tensor([1.0, -0.5])
    just_below = VACUOUS_FRACTION * 0.99
    assert compare_tensor(ref, ref, just_below, 0.0, strict=True).passed
    c = compare_tensor(ref, ref, VACUOUS_FRACTION, 0.0, strict=True)
    assert not c.passed and c.kind is Kind.VACUOUS
    # rtol counts too: atol 0 with rtol 0.5 allows half of every value.
    assert compare_tensor(ref, ref, 0.0, 0.5, strict=True).kind is Kind.VACUOUS


def test_an_all_zero_reference_is_compared_exactly_not_called_vacuous() -> None:
    ref = torch.zeros(3)
    assert compare_tensor(ref, ref.clone(), 1e-5, 1e-4, strict=True).passed
    assert compare_tensor(ref, ref + 1, 1e-5, 1e-4, strict=True).kind is Kind.TOLERANCE


def test_nan_or_inf_in_a_backend_output_is_a_failure_of_its_own_kind() -> None:
    ref = torch.ones(4)
    for bad in (float("nan"), float("inf"), -float("inf")):
        got = ref.clone()
        got[1] = bad
        c = compare_tensor(ref, got, 1e-5, 1e-4, strict=True)
        assert not c.passed and c.kind is Kind.NON_FINITE, bad
        assert isinstance(c.error("x"), NonFiniteOutputError)
    # Strict: NaN in the same place on both sides still fails (the reference is not a reference).
    both = torch.tensor([1.0, float("nan")])
    c = compare_tensor(both, both.clone(), 1e-5, 1e-4, strict=True)
    assert not c.passed and c.kind is Kind.NON_FINITE


def test_statistics_say_how_far_off_and_what_would_have_passed() -> None:
    ref = torch.linspace(-3, 3, 1000, dtype=torch.float64).float()
    got = ref.clone()
    got[10] += 0.25
    c = compare_tensor(ref, got, atol=1e-5, rtol=1e-4, strict=True)
    assert c.kind is Kind.TOLERANCE and not c.passed
    assert isinstance(c.error("w"), ToleranceError) and isinstance(c.error("w"), ParityError)
    assert math.isclose(c.max_abs, 0.25, rel_tol=1e-5)
    assert c.p99_abs == 0.0  # one bad value in a thousand is above the 99th percentile
    assert math.isclose(c.ref_max, 3.0, rel_tol=1e-6)
    assert math.isclose(c.ref_std, float(ref.double().std()), rel_tol=1e-6)
    # The smallest passing tolerances really pass, and a hair less does not.
    assert compare_tensor(ref, got, c.min_atol, 1e-4).passed
    assert not compare_tensor(ref, got, c.min_atol * 0.99, 1e-4).passed
    assert compare_tensor(ref, got, 1e-5, c.min_rtol * 1.0001).passed
    assert not compare_tensor(ref, got, 1e-5, c.min_rtol * 0.99).passed
    assert sum(c.hist) == ref.numel() and len(c.hist) == len(HIST_DECADES) + 1
    assert c.hist[0] == ref.numel() - 1  # every other value is exactly equal


def test_top1_agreement_for_classifier_outputs() -> None:
    ref = torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0]])
    got = torch.tensor([[0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    assert compare_tensor(ref, got, 1e-5, 1e-4, classifier=True).top1 == 0.5
    assert compare_tensor(ref, got, 1e-5, 1e-4).top1 is None


def test_shape_and_dtype_failures_are_typed() -> None:
    c = compare_tensor(torch.zeros(2, 3), torch.zeros(3, 2), 1e-5, 1e-4, strict=True)
    assert c.kind is Kind.SHAPE and isinstance(c.error("x"), ShapeMismatchError)
    assert c.to_json()["max_abs"] == "inf"  # JSON has no Infinity


def test_a_report_raises_its_most_severe_failure_kind_with_every_error_attached() -> None:
    ref = torch.ones(3)
    off = compare_tensor(ref, ref + 1, 1e-5, 1e-4, strict=True)
    nan = compare_tensor(ref, ref * float("nan"), 1e-5, 1e-4, strict=True)
    ok = compare_tensor(ref, ref, 1e-5, 1e-4, strict=True)
    rows = [
        Row.of("a", "golden", "y", ok, 1e-5, 1e-4),
        Row.of("b", "golden", "y", off, 1e-5, 1e-4),
        Row.of("c", "golden", "y", nan, 1e-5, 1e-4),
        Row.missing("d", "golden", "z", 1e-5, 1e-4),
    ]
    report = ParityReport("m", "/x", "now", {"atol": 1e-5, "rtol": 1e-4}, {}, rows)
    with pytest.raises(ParityError) as caught:
        report.raise_for_failures()
    assert isinstance(caught.value, MissingOutputError)  # missing outranks the numbers
    kinds = {type(e) for e in caught.value.errors}  # type: ignore[attr-defined]
    assert kinds == {ToleranceError, NonFiniteOutputError, MissingOutputError}
    assert "b / golden / y" in str(caught.value)
    ParityReport("m", "/x", "now", {"atol": 1e-5, "rtol": 1e-4}, {}, rows[:1]).raise_for_failures()


# --- the element that decided the check (issue 20) -------------------------------------------


def test_the_bound_element_uses_the_largest_share_of_its_allowance_and_decides_pass_fail() -> None:
    gen = torch.Generator().manual_seed(0)
    for scale, noise in ((1.0, 1e-5), (1e-2, 3e-6), (100.0, 1e-2), (1.0, 1e-3)):
        ref = torch.randn(64, generator=gen, dtype=torch.float64) * scale
        got = ref + torch.randn(64, generator=gen, dtype=torch.float64) * noise
        c = compare_tensor(ref, got, 1e-5, 1e-4)
        assert c.bound_used is not None and c.bound_err is not None and c.bound_ref is not None
        share = (got - ref).abs() / (1e-5 + 1e-4 * ref.abs())
        assert math.isclose(c.bound_used, float(share.max()), rel_tol=1e-12)
        assert c.passed == (c.bound_used <= 1.0), (scale, noise)
        assert math.isclose(c.bound_allowed, 1e-5 + 1e-4 * c.bound_ref, rel_tol=1e-12)
        assert math.isclose(c.bound_err, c.bound_used * c.bound_allowed, rel_tol=1e-12)


def test_the_bound_with_no_allowance_is_infinitely_over_and_exact_uses_none() -> None:
    ref = torch.tensor([0.0, 1.0, 0.0])
    c = compare_tensor(ref, torch.tensor([0.0, 1.0, 2e-6]), atol=0.0, rtol=1e-4)
    assert not c.passed and c.bound_used == float("inf") and c.bound_err == pytest.approx(2e-6)
    assert c.to_json()["bound_used"] == "inf"
    exact = compare_tensor(ref, ref.clone(), 0.0, 0.0)
    assert exact.passed and exact.bound_used == 0.0 and exact.bound_err == 0.0
    # Pass/fail checks without detail single nothing out: None, not a 0 that reads as exact.
    assert compare_tensor(ref, ref + 1, 1e-5, 1e-4, detail=False).bound_used is None


def test_a_vacuous_tolerance_is_flagged_on_the_comparison_whether_or_not_accepted() -> None:
    tiny = torch.full((3,), 1e-8)
    assert compare_tensor(tiny, tiny * 0, 1e-5, 1e-4, strict=True, allow_vacuous=True).vacuous
    assert compare_tensor(tiny, tiny * 0, 1e-5, 1e-4).vacuous  # the plain rule passes it: flagged
    assert not compare_tensor(tiny * 1e8, tiny * 1e8, 1e-5, 1e-4).vacuous
    # The flag and the strict rule agree: a VACUOUS failure is always flagged.
    refused = compare_tensor(tiny, tiny * 0, 1e-5, 1e-4, strict=True)
    assert refused.kind is Kind.VACUOUS and refused.vacuous
