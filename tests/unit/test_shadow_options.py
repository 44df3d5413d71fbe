"""`--shadow RATE` and `--shadow-max-rate N` (pipeline/serving/shadowopts.py): a refusal
names only the option that is wrong (a user's trial: `--shadow 2` also blamed the
default --shadow-max-rate, "a positive rate, got 20.0")."""

from __future__ import annotations

import pytest

from pipeline.serving.server import ServeError
from pipeline.serving.shadowopts import DEFAULT_MAX_RATE, check_rates


def test_a_wrong_rate_is_named_alone() -> None:
    with pytest.raises(ServeError) as err:
        check_rates(2, DEFAULT_MAX_RATE)
    assert "--shadow is a share" in str(err.value) and "got 2" in str(err.value)
    assert "--shadow-max-rate" not in str(err.value)


def test_a_wrong_max_rate_is_named_alone_and_both_together() -> None:
    with pytest.raises(ServeError) as err:
        check_rates(0.5, 0)
    assert str(err.value) == "--shadow-max-rate is a positive rate, got 0."
    with pytest.raises(ServeError, match="got -1; --shadow-max-rate is a positive rate, got -3"):
        check_rates(-1, -3)
    check_rates(0.01, DEFAULT_MAX_RATE)  # good ones pass
