import math

import torch

from pipeline.core.compare import compare_outputs, compare_tensor, flatten_outputs


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
    assert "output 1" in compare_outputs([a, b], [a, b + 1], 1e-5, 1e-4)
