"""The load test's summary (pipeline/serving/loadreport.py): answers from several versions
held to one export are "wrong" with no word on why (a user's loadtest during a canary,
2026-11-28: wrong 750, FAILED); the summary says to check each against its own version."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.core.budget import Budget
from pipeline.serving.loadjudge import PooledAnswers
from pipeline.serving.loadreport import LoadReport, to_markdown

HINT = "run with --by-version"


def _report(by_version: dict[str, int], wrong: int, checked: bool) -> LoadReport:
    report = LoadReport("digits_lenet", 1000, 4, answered=1000, wrong=wrong)
    report.by_version, report.checked_by_version = by_version, checked
    return report


def test_wrong_answers_from_several_versions_point_to_by_version() -> None:
    said = _report({"1": 750, "2": 250}, 250, checked=False).summary()
    assert "answers by version: 1: 750, 2: 250" in said and HINT in said, said
    assert said.endswith("FAILED: 250 answer(s) wrong"), said


def test_the_hint_is_only_where_it_applies() -> None:
    assert HINT not in _report({"1": 1000}, 3, checked=False).summary()  # one version
    assert HINT not in _report({"1": 750, "2": 250}, 0, checked=False).summary()  # none wrong
    assert HINT not in _report({"1": 750, "2": 250}, 2, checked=True).summary()  # it did


def test_a_time_limit_that_ended_the_run_is_said_and_not_sent_is_its_own_column() -> None:
    """--time-limit 1 --requests 5000: it said "5000 requests … in 1.1 s" and the table's
    failed column held the 4,757 never sent while the text said failed 0."""
    report = LoadReport("digits_lenet", 5000, 4, answered=243, not_sent=4757, duration_s=1.1)
    said = report.summary()
    assert said.startswith("digits_lenet: 243 of 5000 requests at concurrency 4 in 1.1 s"), said
    assert "the time limit ended the run with 4757 request(s) not sent" in said
    assert said.splitlines()[-1].startswith("  FAILED: 4757 request(s) not sent: --time-limit")
    header, _, row = to_markdown([report]).splitlines()
    cells = dict(zip(header.split("|"), row.split("|"), strict=True))
    assert cells[" failed "] == " 0 " and cells[" not sent "] == " 4757 ", cells


def _pooled(precision: str = "int8") -> PooledAnswers:
    return PooledAnswers("onnx_int8_dynamic", precision, ["logits"], Budget())


def test_reduced_answers_are_held_to_the_sqnr_floor_not_elementwise() -> None:
    gen = torch.Generator().manual_seed(0)
    close, far = _pooled(), _pooled()
    for _ in range(64):
        ref = torch.randn(1, 10, generator=gen)
        assert (
            close.add({"logits": ref}, {"logits": ref + 0.01 * torch.randn(1, 10, generator=gen)})
            == ""
        )
        assert (
            far.add({"logits": ref}, {"logits": ref + 0.5 * torch.randn(1, 10, generator=gen)})
            == ""
        )
    [passed], [failed] = close.verdicts(), far.verdicts()
    assert passed.passed and passed.value > 30 and passed.bound == 20.0  # int8's floor
    assert not failed.passed and failed.value < 20
    report = LoadReport("digits_lenet_onnx_int8d", 64, 4, answered=64)
    report.judged, report.judged_as = [failed.to_json() | {"said": failed.describe()}], "x (int8)"
    assert not report.passed and "    logits: FAILED: " in report.summary()


def test_a_reduced_answer_of_another_shape_is_wrong_at_once() -> None:
    problem = _pooled().add({"logits": torch.zeros(1, 10)}, {"logits": torch.zeros(1, 9)})
    assert problem == "output 'logits' has shape (1, 9), eager's (1, 10)"
    assert _pooled().add({"logits": torch.zeros(1, 10)}, {}) == "output 'logits' missing"


def test_the_runs_start_is_said_only_once_its_options_and_server_are_checked(
    tmp_path: Path,
) -> None:
    # "5000 requests at concurrency 4 ..." was printed, then the options were refused.
    import pytest

    from pipeline.serving.loadtest import LoadConfig, LoadTestError, run_served
    from pipeline.serving.server import ServeError

    said: list[str] = []
    bad = LoadConfig(export_dir=tmp_path, requests=10, kill_worker_after=50, run_dir=tmp_path)
    with pytest.raises(LoadTestError, match="--kill-worker-after"):
        run_served(bad, say=said.append)
    # --serve: refused before a private server is started for the run (it took 8-25 s).
    for bad, said_as in (({"requests": 0}, "--requests"), ({"kill_node_after": 5}, "cluster")):
        with pytest.raises(LoadTestError, match=said_as):
            run_served(
                LoadConfig(**{"export_dir": tmp_path, "requests": 10, "runtime": "kserve", **bad}),
                private=True,
                say=said.append,
            )
    with pytest.raises(ServeError, match="No server is running"):
        run_served(LoadConfig(export_dir=tmp_path, requests=10, run_dir=tmp_path), say=said.append)
    assert said == []


def test_a_json_null_for_eager_s_inf_is_no_wrong_answer() -> None:
    """The servers write NaN and Inf as JSON null (JSON has no Infinity), read back as NaN:
    loadtest counted an output that overflows in eager too as a wrong answer."""
    import httpx
    import torch

    from pipeline.serving.loadtest import _json_infinities

    eager = {"y": torch.tensor([[float("inf"), -float("inf"), 1.0]])}
    got = {"y": torch.tensor([[float("nan"), float("nan"), 1.0]])}
    json_answer = httpx.Response(200, json={})
    assert torch.equal(_json_infinities(json_answer, eager, got)["y"], eager["y"])
    binary = httpx.Response(200, headers={"Inference-Header-Content-Length": "10"})
    assert _json_infinities(binary, eager, got)["y"].isnan().sum() == 2  # it carries Inf
    wrong = {"y": torch.tensor([[float("nan"), 0.0, 1.0]])}  # a finite value for -Inf stays
    assert _json_infinities(json_answer, eager, wrong)["y"][0, 1] == 0.0
