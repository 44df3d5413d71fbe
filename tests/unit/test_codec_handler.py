"""The handler around the codec, run as a TorchServe worker runs it, without Java.

A tiny hand-made export (a scripted module, its manifest and golden inputs)
is archived through `pipeline.runtimes.torchserve.archive`, unpacked, and loaded with
TorchServe's own `TsModelLoader` (which imports the archive's handler file and
calls `initialize` with a real `ts.context.Context`); requests then go through
`BaseHandler.handle` exactly as `Service.predict` passes them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from torch import nn

from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.runtimes.torchserve.constants import ARCHIVE_INFO
from pipeline.runtimes.torchserve.store import read_info
from pipeline_runtime.files import IntegrityError, sha256_file
from pipeline_runtime.manifest import (
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    Serving,
    TensorRecord,
    Tolerance,
)
from tests import ts_worker


class Tiny(nn.Module):
    """Sums a (seq, batch, 3) input over seq: its batch axis is not the first."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 5)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return self.linear(xs.sum(0))


class Fragile(Tiny):
    """Tiny, failing on values it cannot take (as an embedding fails on a token id past
    its rows)."""

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        if bool((xs < -100).any()):
            raise ValueError("a value below -100")
        return self.linear(xs.sum(0))


def _export(root: Path, *, stack_requests: bool = True, model: nn.Module | None = None) -> Path:
    torch.manual_seed(0)
    model = (model or Tiny()).eval()
    out = root / "export"
    out.mkdir(parents=True)
    torch.jit.script(model).save(str(out / "model.torchscript.pt"))
    golden = torch.randn(2, 4, 3)
    torch.save({"inputs": {"xs": golden}, "outputs": {"logits": model(golden)}}, out / "golden.pt")
    manifest = Manifest(
        model=ModelRecord("tiny"),
        inputs=(TensorRecord("xs", ("seq", "batch", 3), "float32"),),
        outputs=(TensorRecord("logits", ("batch", 5), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("../checkpoint.pt", "0" * 64),
        artifacts={
            "torchscript": ArtifactRecord(
                "model.torchscript.pt", "torchscript", sha256_file(out / "model.torchscript.pt")
            ),
            "golden": ArtifactRecord("golden.pt", "torch.save", sha256_file(out / "golden.pt")),
        },
        serving=Serving(topk=2, stack_requests=stack_requests),
    )
    (out / "manifest.json").write_text(manifest.dumps())
    return out


def _unpacked(root: Path, export_dir: Path) -> Path:
    (mar,) = archive(
        ArchiveConfig(
            model="tiny", export_dir=export_dir, store=root / "store", formats=("torchscript",)
        )
    )
    model_dir = root / "model_dir"
    with zipfile.ZipFile(mar) as zf:
        zf.extractall(model_dir)
    return model_dir


def _load(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The archive loaded as a TorchServe worker loads it: a `ts.service.Service`."""
    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
    from ts.model_loader import TsModelLoader

    monkeypatch.syspath_prepend(str(model_dir))  # TorchServe runs workers in the model dir
    monkeypatch.delitem(sys.modules, "torchscript_handler", raising=False)
    metrics = MetricsCacheYamlImpl(
        os.path.join(os.path.dirname(ts.__file__), "configs", "metrics.yaml")
    )
    metrics.initialize_cache()
    return TsModelLoader().load(
        "tiny_ts", str(model_dir), "torchscript_handler.py", None, 8, metrics_cache=metrics
    )


def _handle(
    service: Any, bodies: list[Any], headers: dict[str, str] | None = None
) -> list[tuple[int, Any]]:
    """One batch through the handler; (status, answer) per request."""
    return ts_worker.infer(service, bodies, headers)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path]:
    export_dir = _export(tmp_path)
    return _load(_unpacked(tmp_path, export_dir), monkeypatch), export_dir


def _expected(export_dir: Path, xs: torch.Tensor) -> torch.Tensor:
    return torch.jit.load(str(export_dir / "model.torchscript.pt"))(xs)


def test_archive_json_names_the_model_and_format(tmp_path: Path) -> None:
    export_dir = _export(tmp_path)
    model_dir = _unpacked(tmp_path, export_dir)
    info = json.loads((model_dir / ARCHIVE_INFO).read_text())
    assert (info["model"], info["format"], info["fastest"]) == ("tiny", "torchscript", None)
    assert not list(model_dir.rglob("__pycache__"))
    handler = (model_dir / "torchscript_handler.py").read_text()
    assert "import pipeline_runtime" in handler or "from pipeline_runtime" in handler
    assert "from pipeline." not in handler and "import pipeline\n" not in handler


def test_archive_json_carries_the_fastest_backend_bench_measured(tmp_path: Path) -> None:
    export_dir = _export(tmp_path)
    entry = {"backend": "torchscript_frozen", "format": "torchscript", "median_ms": 0.1}
    results = tmp_path / "fastest.json"
    results.write_text(json.dumps({"tiny": entry, "other": {"format": "onnx"}}))
    (mar,) = archive(
        ArchiveConfig(
            model="tiny",
            export_dir=export_dir,
            store=tmp_path / "store",
            formats=("torchscript",),
            bench_results=results,
        )
    )
    info = read_info(mar)
    assert info is not None and info.fastest == entry
    assert info.sha256 == sha256_file(export_dir / "model.torchscript.pt")
    # The export itself is never written to after export.
    assert "fastest" not in json.loads((export_dir / "manifest.json").read_text())
    # Stored, not deflated (archive.py: weights barely compress, deflating cost seconds).
    with zipfile.ZipFile(mar) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}


def test_requests_are_batched_on_their_batch_axis_and_fail_alone(
    served: tuple[Any, Path], caplog: pytest.LogCaptureFixture
) -> None:
    service, export_dir = served
    a, b = torch.randn(4, 1, 3), torch.randn(4, 2, 3)  # same seq, batch on axis 1
    bodies = [
        json.dumps({"inputs": a.tolist()}).encode(),
        b'{"inputs": [[1.0, 2.0]]}',
        {"inputs": {"xs": b.tolist()}},  # TorchServe hands JSON bodies over parsed
        None,  # a form post
    ]
    with caplog.at_level(logging.INFO):
        answers = _handle(service, bodies)
    assert [status for status, _ in answers] == [200, 400, 200, 415]
    assert "must have shape" in answers[1][1]["error"]
    assert "form fields" in answers[3][1]["error"]
    assert any("dynamic batching: 2 requests" in r.getMessage() for r in caplog.records)
    for (_, answer), xs in ((answers[0], a), (answers[2], b)):
        expected = _expected(export_dir, xs)
        torch.testing.assert_close(torch.tensor(answer["outputs"]["logits"]), expected)
        assert len(answer["topk"]) == xs.shape[1] and len(answer["topk"][0]) == 2
    # BaseHandler.handle ran the steps: it records HandlerTime.
    assert any("[METRICS]HandlerTime" in r.getMessage() for r in caplog.records)


def test_a_request_the_model_cannot_take_fails_alone_not_its_stacked_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stacked into one pass, a bad request failed every request with it (a 500 each). Its
    500 carried TorchScript's whole traceback, the server's file paths included."""
    torch.manual_seed(0)
    export_dir = _export(tmp_path, model=Fragile())
    service = _load(_unpacked(tmp_path, export_dir), monkeypatch)
    good = [torch.randn(4, 1, 3) for _ in range(3)]
    bad = torch.full((4, 1, 3), -1000.0)
    answers = _handle(service, [{"inputs": x.tolist()} for x in (good[0], bad, *good[1:])])
    assert [status for status, _ in answers] == [200, 500, 200, 200], answers
    # The error's one line: not the TorchScript traceback with the server's source and paths.
    assert answers[1][1]["error"] == "Inference failed: builtins.ValueError: a value below -100"
    for (_, answer), xs in zip((answers[0], *answers[2:]), good, strict=True):
        torch.testing.assert_close(
            torch.tensor(answer["outputs"]["logits"]), _expected(export_dir, xs)
        )


def test_describe_answers_the_io_contract(served: tuple[Any, Path]) -> None:
    service, _ = served
    ((status, contract),) = _handle(service, [b"{}"], {"describe": "True"})
    assert status == 200
    assert contract["model"] == "tiny" and contract["format"] == "torchscript"
    assert contract["inputs"] == [{"name": "xs", "shape": ["seq", "batch", 3], "dtype": "float32"}]
    assert contract["outputs"] == [{"name": "logits", "shape": ["batch", 5], "dtype": "float32"}]
    assert contract["topk"] == 2 and contract["accepts_images"] is False


def test_models_that_must_not_be_stacked_run_each_request_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    export_dir = _export(tmp_path, stack_requests=False)
    service = _load(_unpacked(tmp_path, export_dir), monkeypatch)
    xs = [torch.randn(2, 1, 3), torch.randn(2, 1, 3)]
    with caplog.at_level(logging.INFO):
        answers = _handle(service, [json.dumps({"inputs": x.tolist()}).encode() for x in xs])
    assert not any("dynamic batching" in r.getMessage() for r in caplog.records)
    for (status, answer), x in zip(answers, xs, strict=True):
        assert status == 200
        torch.testing.assert_close(
            torch.tensor(answer["outputs"]["logits"]), _expected(export_dir, x)
        )


def test_a_tampered_artifact_is_refused_at_initialize(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = _unpacked(tmp_path, _export(tmp_path))
    artifact = model_dir / "model.torchscript.pt"
    artifact.write_bytes(artifact.read_bytes() + b"\x00")
    with pytest.raises(IntegrityError, match=r"Refusing to serve model\.torchscript\.pt"):
        _load(model_dir, monkeypatch)


def test_a_form_body_torchserve_emptied_gets_a_415_not_empty_body(
    served: tuple[Any, Path],
) -> None:
    """TorchServe decodes curl's default type itself and drops a body without '=' (JSON,
    most images): the handler sees no field at all, only the request's Content-Type."""
    from ts.service import Service

    service, _ = served
    rows = [
        {
            "requestId": b"r0",
            "parameters": [],
            "headers": [{"name": b"Content-Type", "value": b"application/x-www-form-urlencoded"}],
        },
        {"requestId": b"r1", "parameters": [], "headers": []},
    ]
    processors, inputs, ids = Service.retrieve_data_for_inference(rows)
    service.context.request_ids = ids
    service.context.request_processor = processors
    service.context.metrics.request_ids = ids
    answers = [json.loads(a) for a in service._entry_point(inputs, service.context)]
    statuses = [service.context.get_response_status(i)[0] for i in range(2)]
    assert statuses == [415, 400]
    assert "curl's default" in answers[0]["error"]
    assert "Empty request body" in answers[1]["error"]


def test_requests_are_limited_to_32_batches_of_samples(served: tuple[Any, Path]) -> None:
    """The archive was loaded with batch size 8: 256 samples per request at most."""
    service, _ = served
    ((_, contract),) = _handle(service, [b"{}"], {"describe": "True"})
    assert contract["max_samples"] == 256
    ok, over = _handle(
        service,
        [
            json.dumps({"inputs": torch.zeros(1, 256, 3).tolist()}).encode(),
            json.dumps({"inputs": torch.zeros(1, 257, 3).tolist()}).encode(),
        ],
    )
    assert ok[0] == 200 and len(ok[1]["outputs"]["logits"]) == 256
    assert over[0] == 413 and "257 samples" in over[1]["error"]


def test_the_sample_limit_comes_from_env_then_model_config_then_batch_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline_runtime.handler import max_samples
    from pipeline_runtime.request import MAX_SAMPLES_ENV

    monkeypatch.delenv(MAX_SAMPLES_ENV, raising=False)
    assert max_samples(8) == 256
    assert max_samples(1, {"other": 1}) == 32
    assert max_samples(8, {"max_samples": 40}) == 40
    monkeypatch.setenv(MAX_SAMPLES_ENV, "12")
    assert max_samples(8, {"max_samples": 40}) == 12
    for bad in ("0", "-3", "many", "2.5"):
        monkeypatch.setenv(MAX_SAMPLES_ENV, bad)
        with pytest.raises(ValueError, match=MAX_SAMPLES_ENV):
            max_samples(8)
    monkeypatch.delenv(MAX_SAMPLES_ENV)
    for bad_value in (0, True, 2.5, "x"):
        with pytest.raises(ValueError, match=r"model-config\.yaml"):
            max_samples(8, {"max_samples": bad_value})


def test_an_oip_request_gets_the_outputs_it_asked_for_or_a_400(served: tuple[Any, Path]) -> None:
    """As the KServe and Ray runtimes answer (pipeline_runtime.asked): TorchServe answered
    every output, and 200 for an output name the model does not have."""
    service, export_dir = served
    xs = torch.randn(4, 1, 3)
    tensor = {
        "name": "xs",
        "shape": list(xs.shape),
        "datatype": "FP32",
        "data": xs.flatten().tolist(),
    }

    def body(**extra: Any) -> bytes:
        return json.dumps({"inputs": [tensor], **extra}).encode()

    answers = _handle(
        service,
        [
            body(outputs=[{"name": "logits"}]),
            body(outputs=[{"name": "nope"}]),
            body(outputs=[{"name": "logits"}], parameters={"binary_data_output": True}),
            body(outputs="logits"),
            body(outputs=[{"name": None}, {"name": "logits"}]),
            body(outputs=[{"name": ["a"]}]),
            body(outputs=[{"name": "logits"}], parameters=5),
            body(parameters={"binary_data_output": True}),  # no outputs listed: the same rule
        ],
    )
    assert [status for status, _ in answers] == [200] + [400] * 7, answers
    (ok,) = answers[0][1]["outputs"]
    assert ok["name"] == "logits"
    # As the other runtimes' OIP answers: the version that answered (the archive's).
    assert answers[0][1]["model_version"] == "1.0", answers[0][1]
    torch.testing.assert_close(
        torch.tensor(ok["data"]).reshape(ok["shape"]), _expected(export_dir, xs)
    )
    assert "No output named ['nope']" in answers[1][1]["error"]
    assert "JSON only" in answers[2][1]["error"]
    assert "'outputs' must be a list" in answers[3][1]["error"]
    for _, answer in answers[4:6]:  # a 400 that says so, not a decoding TypeError
        assert "each with a string 'name'" in answer["error"], answer
    assert "'parameters' must be an object" in answers[6][1]["error"]
    assert "JSON only" in answers[7][1]["error"]


def test_answers_past_the_response_limit_are_refused_not_the_worker(
    served: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer past TorchServe's max_response_size killed the worker (the frontend's
    TooLongFrameException), in a loop for a model whose one answer never fits: serve said
    it was up while every request got 503 (a user's Mask R-CNN trial)."""
    from pipeline_runtime import responses

    service, _ = served
    big, small = torch.randn(4, 6, 3), torch.randn(4, 1, 3)  # 6 samples' answer, and 1's
    bodies = [{"inputs": big.tolist()}, {"inputs": small.tolist()}, {"inputs": small.tolist()}]
    # The size of each answer as the handler writes it (compact JSON, orjson's).
    sizes = [len(orjson.dumps(answer)) for _, answer in _handle(service, bodies)]
    # The 6 samples' answer cannot fit; each other fits (the frontend checks each alone).
    monkeypatch.setenv(responses.MAX_RESPONSE_ENV, str(max(sizes[1:])))
    answers = _handle(service, bodies)
    assert [status for status, _ in answers] == [500, 200, 200], answers
    assert (
        f"The answer is {sizes[0]} bytes, over this server's response limit"
        in (answers[0][1]["error"])
    )
    assert "--max-response-size 1048576 or more" in answers[0][1]["error"]
    assert len(answers[2][1]["outputs"]["logits"]) == 1


def test_an_output_that_overflows_is_answered_as_json_null(served: tuple[Any, Path]) -> None:
    """Finite inputs whose sum overflows float32: the answer said Infinity, which is not
    JSON (orjson and browsers refused the whole answer); null, as the KServe runtime's."""
    service, _ = served
    ((status, answer),) = _handle(service, [{"inputs": [[[3e38, 3e38, 3e38]]] * 4}])
    assert status == 200, answer
    (row,) = answer["outputs"]["logits"]
    assert None in row, row  # the overflowed logits; the finite ones stay numbers
