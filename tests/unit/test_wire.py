"""`pipeline.serving.wire`: each runtime's bodies and answers, checked against kserve's own
reader and writer of the Open Inference Protocol (not against this module's idea of it)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from pipeline.serving import runtime, wire
from pipeline_runtime import oip


@pytest.fixture(scope="module")
def kserve_types():
    """kserve's InferRequest/InferResponse (imported with pytest's arguments hidden)."""
    infer_type = oip.kserve_module("kserve.protocol.infer_type")
    return infer_type.InferRequest, infer_type.InferResponse, infer_type.InferOutput


INPUTS = {
    "x": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
    "n": torch.tensor([[1, -2]], dtype=torch.int64),
}


def test_routes_follow_the_runtime() -> None:
    assert runtime.get("torchserve").protocol.infer_path("m_ts") == "/predictions/m_ts"
    assert runtime.get("kserve").protocol.infer_path("m") == "/v2/models/m/infer"


@pytest.mark.parametrize("binary", [False, True])
def test_kserve_reads_our_requests_exactly(kserve_types, binary: bool) -> None:
    InferRequest, _, _ = kserve_types
    body = runtime.get("kserve").protocol.encode(INPUTS, binary=binary)
    if binary:
        length = int(body.headers[wire.HEADER_LENGTH])
        request = InferRequest.from_bytes(body.content, length, "m")
    else:
        assert body.content_type == "application/json" and wire.HEADER_LENGTH not in body.headers
        from kserve.protocol.rest.v2_datamodels import InferenceRequest

        request = InferRequest.from_inference_request(
            InferenceRequest.model_validate(json.loads(body.content)), "m"
        )
    got = {i.name: i.as_numpy() for i in request.inputs}
    assert set(got) == set(INPUTS)
    for name, t in INPUTS.items():
        assert got[name].dtype == t.numpy().dtype
        np.testing.assert_array_equal(got[name], t.numpy())  # bit-exact, both ways


def test_torchserve_bodies_are_the_handlers_formats() -> None:
    body = runtime.get("torchserve").protocol.encode({"x": INPUTS["x"]}, binary=True)
    assert body.content_type == "application/octet-stream"
    np.testing.assert_array_equal(np.load(io.BytesIO(body.content)), INPUTS["x"].numpy())
    body = runtime.get("torchserve").protocol.encode(INPUTS)
    assert json.loads(body.content) == {"inputs": {k: v.tolist() for k, v in INPUTS.items()}}


@pytest.mark.parametrize("binary", [False, True])
def test_decode_reads_kservers_answers(kserve_types, binary: bool) -> None:
    _, InferResponse, InferOutput = kserve_types
    outputs = []
    for name, t in INPUTS.items():
        a = t.numpy()
        out = InferOutput(name=name, shape=list(a.shape), datatype=oip.NAMES[str(a.dtype)])
        out.set_data_from_numpy(a, binary_data=binary)
        outputs.append(out)
    response = InferResponse(
        response_id="1", model_name="m", infer_outputs=outputs, use_binary_outputs=binary
    )
    content, json_size = response.to_rest()
    headers = {wire.HEADER_LENGTH.lower(): str(json_size)} if json_size is not None else {}
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    got = runtime.get("kserve").protocol.decode(raw, headers)
    for name, t in INPUTS.items():
        assert got[name].dtype == t.dtype
        torch.testing.assert_close(got[name], t, rtol=0, atol=0)
    # TorchServe's protocol reads its handler's answers only: it does not guess this one.
    with pytest.raises(wire.WireError, match=r"TorchServe handler answer|named lists"):
        runtime.get("torchserve").protocol.decode(raw, headers)


def test_each_protocol_reads_its_own_answers_and_refuses_what_is_not() -> None:
    handler_answer = json.dumps({"outputs": {"logits": [[0.5, 1.5]]}}).encode()
    ts, oip_ = runtime.get("torchserve").protocol, runtime.get("kserve").protocol
    got = ts.decode(handler_answer)
    torch.testing.assert_close(got["logits"], torch.tensor([[0.5, 1.5]]))
    with pytest.raises(wire.WireError, match="Open Inference Protocol"):
        oip_.decode(handler_answer)  # the handler's shape is not an OIP answer
    for bad in (b"<html>", b'{"error": "x"}', b'{"outputs": 3}', b'{"outputs": [{"name": 1}]}'):
        for protocol in (ts, oip_):
            with pytest.raises(wire.WireError):
                protocol.decode(bad)


def test_request_files_take_the_models_datatypes() -> None:
    meta = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}, {"name": "n", "datatype": "INT64"}]
    # The handlers' JSON: a dict by name, or a bare list for the first input.
    got = wire.oip_from_file(json.dumps({"inputs": {"n": [[3, 4]]}}).encode(), "json", meta)
    assert got["n"].dtype == np.int64 and got["n"].tolist() == [[3, 4]]
    got = wire.oip_from_file(json.dumps({"inputs": [[0.5, 1, 2, 3]]}).encode(), "json", meta)
    assert got["x"].dtype == np.float32 and got["x"].shape == (1, 4)
    buf = io.BytesIO()
    np.save(buf, np.ones((2, 4), dtype=np.float64))
    assert wire.oip_from_file(buf.getvalue(), "npy", meta)["x"].dtype == np.float32
    buf = io.BytesIO()
    np.savez(buf, x=np.zeros((1, 4), np.float32), n=np.array([[1, 2]]))
    assert set(wire.oip_from_file(buf.getvalue(), "npy", meta)) == {"x", "n"}
    # Not advice to load it with allow_pickle= (numpy's message for anything else).
    with pytest.raises(wire.WireError, match=r"neither an \.npy nor an \.npz") as err:
        wire.oip_from_file(b"garbage, not an array", "npy", meta)
    assert "pickle" not in str(err.value)
    with pytest.raises(wire.WireError, match="no input"):
        wire.oip_from_file(json.dumps({"inputs": {"y": [1]}}).encode(), "json", meta)
    # A user's trial: a bare KeyError ("cannot be sent to lstm_tagger: 'inputs'"), and 1.5
    # silently cast to 1 for an integer input the server would have refused.
    # A later trial read the old message ({name: values} for ['n']) as accepting this file:
    # it now says what to write, and that this file's keys belong under "inputs".
    with pytest.raises(wire.WireError, match=r'\{"inputs": \{"x": \[\.\.\.\]\}\}') as err:
        wire.oip_from_file(json.dumps({"n": [[1, 2]]}).encode(), "json", meta)
    assert "this file's keys are ['n']: put them under \"inputs\"" in str(err.value)
    with pytest.raises(wire.WireError, match="'n' is int64, but the file holds fractions"):
        wire.oip_from_file(json.dumps({"inputs": {"n": [[1.5, 2]]}}).encode(), "json", meta)
    whole = wire.oip_from_file(json.dumps({"inputs": {"n": [[1.0, 2]]}}).encode(), "json", meta)
    assert whole["n"].tolist() == [[1, 2]]
