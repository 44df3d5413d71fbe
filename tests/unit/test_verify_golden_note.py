"""A failing golden-file check says why every backend fails: the model changed since export.

Verify compares every backend with eager PyTorch as the model's code is today; a user who
edits their model file after `pipeline export` saw every check fail with no word on why
(reproduced for docs/own-model/my_model.py: 13 of 13 checks failed).
"""

from __future__ import annotations

import torch

from pipeline.core.compare import compare_tensor
from pipeline.verify.report import GOLDEN_CHANGED, GOLDEN_FILE_BACKEND, ParityReport, Row


def _report(*backends: str, scale: float) -> ParityReport:
    ref = torch.arange(4.0)
    rows = [
        Row.of(b, "golden", "logits", compare_tensor(ref, ref * scale, 1e-5, 1e-4), 1e-5, 1e-4)
        for b in backends
    ]
    return ParityReport("m", "export", "now", {}, {}, rows)


def test_a_failing_golden_file_check_explains_itself() -> None:
    message = _report(GOLDEN_FILE_BACKEND, "torchscript", scale=2.0).failure_message()
    assert "golden file / golden / logits" in message
    assert GOLDEN_CHANGED in message and "run `pipeline export` again" in message


def test_other_failures_do_not_blame_the_model_code() -> None:
    failing = _report("torchscript", scale=2.0)
    assert not failing.passed and GOLDEN_CHANGED not in failing.failure_message()
    golden_passes = _report(GOLDEN_FILE_BACKEND, scale=1.0).rows + failing.rows
    report = ParityReport("m", "export", "now", {}, {}, golden_passes)
    assert GOLDEN_CHANGED not in report.failure_message()


def test_tied_detections_that_moved_do_not_blame_the_model_code() -> None:
    """Random weights without spread scores: NMS keeps an arbitrary one of each tie, so
    the golden detections differ from today's eager with no code changed (issue 49)."""
    from pipeline.core import detections as detect
    from pipeline.verify.check import _detection_row

    boxes = torch.tensor([[10.0 * i, 5.0, 10.0 * i + 8, 20.0] for i in range(4)])
    stored = {"boxes": boxes, "scores": torch.full((4,), 0.2),
              "labels": torch.ones(4, dtype=torch.int64), "counts": torch.tensor([4])}  # fmt: skip
    today = {**stored, "boxes": boxes + 50.0}  # other boxes kept, every score still tied
    verdict = detect.compare(stored, today, ("boxes", "scores", "labels"))
    assert verdict.vacuous and verdict.problems == []  # ties: unmatched, excused
    today["scores"] = torch.tensor([0.9, 0.2, 0.2, 0.2])  # one firm one moved: a mismatch
    verdict = detect.compare(stored, today, ("boxes", "scores", "labels"))
    assert verdict.vacuous and verdict.problems
    assert "nor can its" in verdict.problem() and "mismatch" in verdict.problem()
    row = _detection_row(GOLDEN_FILE_BACKEND, "golden", stored, today,
                         ("boxes", "scores", "labels"), {}, 1e-5)  # fmt: skip
    assert not row.passed and row.kind == "vacuous"
    report = ParityReport("m", "export", "now", {}, {}, [row])
    assert "vacuous" in report.failure_message()
    assert GOLDEN_CHANGED not in report.failure_message()


def test_eagers_own_nan_does_not_blame_the_model_code() -> None:
    """`torch.log(x)` on inputs in [-1, 1): eager's NaN is stored and answered again, every
    check fails as not finite, and the note said the model's code had changed (a user's
    trial): it says that eager itself answers NaN there, and what to do."""
    from pipeline.verify.report import NOT_FINITE

    ref = torch.tensor([float("nan"), 1.0])
    found = compare_tensor(ref, ref, 1e-5, 1e-4, strict=True)  # as verify compares
    row = Row.of(GOLDEN_FILE_BACKEND, "golden", "y", found, 1e-5, 1e-4)
    assert not row.passed and row.kind == "non-finite", row.kind
    message = ParityReport("m", "export", "now", {}, {}, [row]).failure_message()
    assert GOLDEN_CHANGED not in message and NOT_FINITE in message
