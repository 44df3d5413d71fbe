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
