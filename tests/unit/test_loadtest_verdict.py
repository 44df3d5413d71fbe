"""A load run's verdict says why it failed (pipeline/serving/loadreport.py).

`pipeline loadtest --time-limit 1` (a user's trial, 2026-11-29): 0 failed, 0 wrong, and a
bare FAILED with exit 1, while the help said it exits 1 "if any request failed or was
wrong". A run cut short fails by design (it checked fewer requests than asked: the
changelog's entry on --time-limit, test_load_report), so the verdict names that cause.
"""

from __future__ import annotations

from pipeline.serving.loadreport import LoadReport


def test_a_run_cut_short_by_the_time_limit_says_that_is_why_it_failed() -> None:
    report = LoadReport("digits_lenet", 5000, 4, answered=243, not_sent=4757, duration_s=1.1)
    assert (report.failed, report.wrong, report.server_errors) == (0, 0, 0)
    assert not report.passed
    verdict = report.summary().splitlines()[-1]
    assert verdict.startswith("  FAILED: 4757 request(s) not sent: --time-limit ended"), verdict
    assert "every one of its --requests" in verdict, verdict
    assert report.to_json()["passed"] is False


def test_the_verdict_names_every_cause_and_a_passed_run_none() -> None:
    report = LoadReport("digits_lenet", 100, 4, answered=97, failed=2, server_errors=1, wrong=1)
    report.judged = [{"output": "logits", "passed": False}, {"output": "aux", "passed": True}]
    assert report.why_failed() == [
        "2 request(s) failed",
        "1 answer(s) of 500 or more",
        "1 answer(s) wrong",
        "logits outside its budget",
    ]
    assert report.summary().endswith("  FAILED: " + "; ".join(report.why_failed()))
    passed = LoadReport("digits_lenet", 100, 4, answered=100)
    assert passed.passed and passed.why_failed() == []
    assert passed.summary().endswith("  PASSED")
