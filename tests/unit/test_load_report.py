"""The load test's summary (pipeline/serving/loadreport.py): answers from several versions
held to one export are "wrong" with no word on why (a user's loadtest during a canary,
2026-11-28: wrong 750, FAILED); the summary says to check each against its own version."""

from __future__ import annotations

from pipeline.serving.loadreport import LoadReport

HINT = "run with --by-version"


def _report(by_version: dict[str, int], wrong: int, checked: bool) -> LoadReport:
    report = LoadReport("digits_lenet", 1000, 4, answered=1000, wrong=wrong)
    report.by_version, report.checked_by_version = by_version, checked
    return report


def test_wrong_answers_from_several_versions_point_to_by_version() -> None:
    said = _report({"1": 750, "2": 250}, 250, checked=False).summary()
    assert "answers by version: 1: 750, 2: 250" in said and HINT in said, said
    assert said.endswith("FAILED")


def test_the_hint_is_only_where_it_applies() -> None:
    assert HINT not in _report({"1": 1000}, 3, checked=False).summary()  # one version
    assert HINT not in _report({"1": 750, "2": 250}, 0, checked=False).summary()  # none wrong
    assert HINT not in _report({"1": 750, "2": 250}, 2, checked=True).summary()  # it did
