"""pipeline.runtimes.kserve.binary: the same InferRequest as kserve's own reader, without the lists."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from pipeline.serving import wire


@pytest.fixture(scope="module")
def kb():
    argv, sys.argv = sys.argv, sys.argv[:1]  # kserve parses sys.argv on import
    try:
        from kserve.errors import InvalidInput
        from kserve.protocol.infer_type import InferRequest

        from pipeline.runtimes.kserve import binary
    finally:
        sys.argv = argv
    return binary, InferRequest, InvalidInput


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
