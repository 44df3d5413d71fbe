"""`pipeline_runtime.codec.oip_arrays`: the Open Inference Protocol's one server-side reader
of input tensors, the same for the KServe runtime (its REST fast path's `oip.Tensor`,
kserve's `InferInput` on its other routes) and for TorchServe's handler (OIP JSON).

Before it, the KServe runtime cast JSON values with numpy: 1.5 for an INT64 input was
served as 1, where TorchServe's handler refused it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline_runtime import codec, oip

TOKENS = [codec.InputSpec("tokens", ("batch", 3), "int64")]
CELL = [
    codec.InputSpec("x", ("batch", 2), "float32"),
    codec.InputSpec("h", ("batch", 2), "float32"),
]


def _kserve_input(name: str, datatype: str, shape: list[int], data: list | np.ndarray):
    """kserve's own input tensor: JSON values as a list, or raw bytes (binary, gRPC)."""
    infer_type = oip.kserve_module("kserve.protocol.infer_type")
    if not isinstance(data, np.ndarray):
        return infer_type.InferInput(name=name, shape=shape, datatype=datatype, data=data)
    item = infer_type.InferInput(name=name, shape=shape, datatype=datatype)
    item.set_data_from_numpy(data, binary_data=True)
    return item


def _handler(body: dict) -> codec.Decoded:
    return codec.decode_request(json.dumps(body).encode(), TOKENS, accepts_images=False)


@pytest.mark.parametrize("values", [[1.5, 2, 3], [1e300, 2, 3], [2**63, 0, 0]])
def test_int64_values_it_cannot_hold_are_refused_on_every_route(values: list) -> None:
    body = {"inputs": [{"name": "tokens", "shape": [1, 3], "datatype": "INT64", "data": values}]}
    routes = {
        "TorchServe's handler (OIP JSON)": lambda: _handler(body),
        "KServe REST (oip.Tensor)": lambda: codec.oip_arrays(
            oip.Request.from_json(body).inputs, TOKENS
        ),
    }
    routes["kserve's InferInput"] = lambda: codec.oip_arrays(
        [_kserve_input("tokens", "INT64", [1, 3], values)], TOKENS
    )
    for route, read in routes.items():
        with pytest.raises(codec.RequestError) as err:
            read()
        assert err.value.status == 400, route
        assert "int64" in str(err.value), (route, str(err.value))


def test_the_same_tensors_read_the_same_on_every_route() -> None:
    x, h = np.array([[0.5, -1.0]], np.float32), np.array([[2.0, 0.25]], np.float32)
    body = {
        "inputs": [
            {"name": n, "shape": [1, 2], "datatype": "FP32", "data": a.reshape(-1).tolist()}
            for n, a in (("x", x), ("h", h))
        ]
    }
    handler = codec.decode_request(json.dumps(body).encode(), CELL, accepts_images=False)
    assert handler.protocol == "v2"
    rest, _ = codec.oip_arrays(oip.Request.from_json(body).inputs, CELL)
    content, length = oip.Request(
        (oip.Tensor.from_array("x", x), oip.Tensor.from_array("h", h))
    ).to_rest(binary=True)
    binary, _ = codec.oip_arrays(
        oip.Request.from_json(json.loads(content[:length]), content[length:]).inputs, CELL
    )
    # kserve's own gRPC decoding: raw contents beside an empty `data` list
    infer_type = oip.kserve_module("kserve.protocol.infer_type")
    message = oip.Request((oip.Tensor.from_array("x", x), oip.Tensor.from_array("h", h))).to_grpc()
    from_grpc, _ = codec.oip_arrays(infer_type.InferRequest.from_grpc(message).inputs, CELL)
    grpc, _ = codec.oip_arrays([_kserve_input("x", "FP32", [1, 2], x), _kserve_input("h", "FP32", [1, 2], h)], CELL)  # fmt: skip
    for got in (handler.arrays, rest, binary, grpc, from_grpc):
        np.testing.assert_array_equal(got["x"], x)
        np.testing.assert_array_equal(got["h"], h)
        got["x"][0, 0] = 9  # each a writable copy, not a view of the request body


@pytest.mark.parametrize(
    ("tensors", "fragment"),
    [
        ([oip.Tensor("x", "FP32", (1, 2), [0.0, 1.0])], "must be named"),
        ([oip.Tensor("x", "INT64", (1, 2), [0, 1]), oip.Tensor("h", "FP32", (1, 2), [0.0, 1.0])], "datatype must be FP32"),
        ([oip.Tensor("x", "FP32", (1, 2, 1, 1), [0.0, 1.0]), oip.Tensor("h", "FP32", (1, 2), [0.0, 1.0])], "too many dimensions"),
        ([oip.Tensor("x", "FP32", (1, 2), [0.0]), oip.Tensor("h", "FP32", (1, 2), [0.0, 1.0])], "must hold 2 values"),
    ],
)  # fmt: skip
def test_what_is_refused_and_why(tensors: list, fragment: str) -> None:
    with pytest.raises(codec.RequestError) as err:
        codec.oip_arrays(tensors, CELL)
    assert err.value.status == 400 and fragment in str(err.value)
