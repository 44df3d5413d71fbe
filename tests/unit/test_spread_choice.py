"""How --random-init picks a detector's score spread among the settings it tried
(pipeline/zoo/detection.py `_steady`): the most firm detections, but only where float32
rounding leaves the rule's score tolerance to the backend."""

from __future__ import annotations

from typing import Any

from pipeline.core.detections import SCORE_ATOL
from pipeline.zoo.detection import ROUNDING_CHECKS, ROUNDING_SHARE, _steady

LIMIT = SCORE_ATOL * ROUNDING_SHARE


class Measured:
    """Float32-against-float64 errors by setting, as `_Rounding.error` reports them, and
    which settings were measured (the real one runs a float64 forward for each)."""

    def __init__(self, errors: dict[tuple[float, float | None], float | None]) -> None:
        self.errors, self.asked = errors, []
        self.current: tuple[float, float | None] | None = None

    def set_spread(self, spread: float, target: float | None) -> None:
        self.current = (spread, target)

    def error(self, answer: Any) -> float | None:
        assert answer == self.current  # measured at the setting it was set to
        self.asked.append(self.current)
        return self.errors[self.current]


def _choose(tried, errors):
    measured = Measured(errors)
    answers = {setting: setting for setting in tried}
    best, said = _steady(tried, answers, measured, measured.set_spread)
    return best, said, measured.asked


def test_the_firmest_setting_wins_when_its_rounding_is_small() -> None:
    tried = {(2.0, None): (150, 200), (4.0, None): (180, 200)}
    best, said, asked = _choose(tried, {(4.0, None): LIMIT / 3, (2.0, None): LIMIT / 9})
    assert best == (4.0, None) and asked == [(4.0, None)]
    assert "at most" in said and "passed over" not in said


def test_a_firmer_setting_whose_rounding_eats_the_tolerance_is_passed_over() -> None:
    tried = {
        (2.0, 0.0): (147, 200),
        (8.0, 0.0): (185, 200),
        (11.3, 0.0): (181, 200),  # larger than a noisy spread at the same target: not measured
        (4.0, None): (170, 200),  # another target: measured
    }
    errors = {(8.0, 0.0): 3e-4, (4.0, None): None, (2.0, 0.0): 8e-5}  # None: a box moved too
    best, said, asked = _choose(tried, errors)
    assert best == (2.0, 0.0)
    assert asked == [(8.0, 0.0), (4.0, None), (2.0, 0.0)]
    assert "3 firmer setting(s) passed over" in said and "8e-05" in said


def test_settings_too_crowded_to_judge_are_not_measured() -> None:
    tried = {(1.0, None): (90, 200), (2.0, None): (99, 200)}
    best, said, asked = _choose(tried, {})
    assert best == (2.0, None) and asked == []
    assert "too few to judge" in said


def test_when_every_judged_setting_rounds_too_far_the_note_says_so() -> None:
    tried = {
        (s, None): (100 + i, 120) for i, s in enumerate((1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0))
    }
    errors = {setting: 5e-4 for setting in tried}
    best, said, asked = _choose(tried, errors)
    assert best == (64.0, None)  # still the firmest: verify then judges, and may fail
    assert len(asked) == ROUNDING_CHECKS  # bounded: each is a float64 forward
    assert "a backend may differ from eager by rounding alone" in said and "by up to 0.0005" in said
