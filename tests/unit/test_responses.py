"""Each TorchServe answer within the frontend's max_response_size (pipeline_runtime/
responses.py): past it the frontend dropped the worker, and a model whose one answer never
fits (Mask R-CNN's masks as JSON) kept every worker dying while serve said it was up."""

from __future__ import annotations

import pytest

from pipeline_runtime.responses import DEFAULT_MAX_RESPONSE, MAX_RESPONSE_ENV, fit, limit


def test_each_answer_over_the_limit_is_refused_and_only_those() -> None:
    # TorchServe's frontend checks each answer's length alone, not the batch's total.
    assert fit([1000, 900, 50], 1000) == []
    refused = fit([2000, 600, 1001, 50], 1000)
    assert [(r.index, r.status) for r in refused] == [(0, 500), (2, 500)]
    assert "The answer is 2000 bytes" in refused[0].message
    assert "--max-response-size 1048576 or more" in refused[0].message  # rounded up to MiB


def test_the_limit_is_what_serve_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_RESPONSE_ENV, raising=False)
    assert limit() == DEFAULT_MAX_RESPONSE  # what serve and deploy kserve configure
    for value, want in (("1000", 1000), ("0", None), ("x", None), ("²", None)):
        monkeypatch.setenv(MAX_RESPONSE_ENV, value)
        assert limit() == (want or DEFAULT_MAX_RESPONSE), value


def test_deploy_kserves_torchserve_is_given_the_limit_the_handler_keeps() -> None:
    # A review: the pods' config.properties set none, so TorchServe's own 6,553,500 bytes
    # applied while the handler kept to none, and the worker deaths came back there.
    from pipeline.runtimes.torchserve.properties import on_kserve

    assert on_kserve("m_onnx")["max_response_size"] == str(DEFAULT_MAX_RESPONSE)
