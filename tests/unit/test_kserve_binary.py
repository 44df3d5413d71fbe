"""pipeline.runtimes.kserve.binary: the same InferRequest as kserve's own reader, without the lists."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.serving import wire
from pipeline_runtime import oip


@pytest.fixture(scope="module")
def kb():
    """The module and kserve's types, imported with pytest's arguments hidden from kserve."""
    binary = oip.kserve_module("pipeline.runtimes.kserve.binary")
    infer_type = oip.kserve_module("kserve.protocol.infer_type")
    return binary, infer_type.InferRequest, oip.kserve_module("kserve.errors").InvalidInput


def test_reads_what_kserve_reads_and_keeps_the_bytes(kb) -> None:
    binary, InferRequest, _ = kb
    inputs = {"x": torch.rand(2, 3, 8, 8), "n": torch.tensor([[1, 2]], dtype=torch.int64)}
    body = wire.oip_binary(inputs)
    length = int(body.headers[wire.HEADER_LENGTH])
    ours = binary.from_bytes(body.content, length, "m")
    theirs = InferRequest.from_bytes(body.content, length, "m")
    assert [i.name for i in ours.inputs] == [i.name for i in theirs.inputs]
    for a, b in zip(ours.inputs, theirs.inputs, strict=True):
        assert a.datatype == b.datatype and a.shape == b.shape
        np.testing.assert_array_equal(a.as_numpy(), b.as_numpy())
        # The point: no per-element Python list (kserve's costs 110 ms for one image).
        assert a._raw_data is not None and not a._data


@pytest.mark.parametrize(
    ("body", "length"),
    [
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}', 61),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", '
         b'"parameters": {"binary_data_size": 8}}]}abcd', 100),
        (b'{"inputs": 3}', 13),
        (b"{}", 5),
        (b"[1]", 3),
        (b"\xff\xfe", 2),
    ],
    ids=["no-data", "short", "inputs-type", "length", "not-a-dict", "not-json"],
)  # fmt: skip
def test_malformed_is_invalid_input(kb, body: bytes, length: int) -> None:
    binary, _, InvalidInput = kb
    with pytest.raises(InvalidInput):
        binary.from_bytes(body, length, "m")


@pytest.mark.parametrize("binary_outputs", [False, True])
def test_answers_are_kserves_own_infer_response(kb, binary_outputs: bool) -> None:
    binary, _, _ = kb
    arrays = {"y": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "k": np.array([3, -1])}
    response = oip.Response(
        tuple(oip.Tensor.from_array(k, v) for k, v in arrays.items()), id="1", model_name="m"
    )
    theirs = binary.infer_response(response, binary_outputs, None)
    assert type(theirs).__name__ == "InferResponse" and theirs.id == "1"
    content, length = theirs.to_rest()  # kserve writes it
    assert (length is not None) == binary_outputs
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    for name, got in oip.Response.from_rest(raw, length).arrays().items():
        assert got.dtype == arrays[name].dtype and got.tobytes() == arrays[name].tobytes()
