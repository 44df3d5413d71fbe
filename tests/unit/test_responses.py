"""A TorchServe batch's answers within the frontend's max_response_size (pipeline_runtime/
responses.py): past it the frontend dropped the worker, and a model whose one answer never
fits (Mask R-CNN's masks as JSON) kept every worker dying while serve said it was up."""

from __future__ import annotations

import pytest

from pipeline_runtime.responses import HEADROOM, MAX_RESPONSE_ENV, fit, limit


def test_answers_too_large_alone_then_the_largest_others_are_refused() -> None:
    most = HEADROOM + 1000
    assert fit([400, 500, 50], most) == []  # 950 fit together
    refused = fit([2000, 600, 500, 50], most)
    assert [(r.index, r.status) for r in refused] == [(0, 500), (1, 503)]
    assert "The answer is 2000 bytes" in refused[0].message
    assert "--max-response-size 1048576 or more" in refused[0].message  # rounded up to MiB
    assert fit([10**9], None) == []  # no limit said: TorchServe's own


def test_the_limit_is_what_serve_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_RESPONSE_ENV, raising=False)
    assert limit() is None
    for value, want in (("16777216", 16777216), ("0", None), ("x", None), ("²", None)):
        monkeypatch.setenv(MAX_RESPONSE_ENV, value)
        assert limit() == want, value
