"""pipeline.runtimes.kserve.binary: typed answers as kserve's own InferResponse."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline_runtime import oip


@pytest.fixture(scope="module")
def kb():
    """The module, imported with pytest's arguments hidden from kserve."""
    return oip.kserve_module("pipeline.runtimes.kserve.binary")


@pytest.mark.parametrize("binary_outputs", [False, True])
def test_answers_are_kserves_own_infer_response(kb, binary_outputs: bool) -> None:
    binary = kb
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


def _grpc_request(*outputs: tuple[str, dict]) -> object:
    """kserve's InferRequest of a gRPC ModelInferRequest asking for `outputs` (name, params)."""
    pb = oip.kserve_module("kserve.protocol.grpc.grpc_predict_v2_pb2")
    infer_type = oip.kserve_module("kserve.protocol.infer_type")
    message = oip.Request(
        (oip.Tensor.from_array("x", np.zeros(2, np.float32)),),
        outputs=tuple({"name": n, "parameters": p} for n, p in outputs),
    ).to_grpc()
    assert isinstance(message, pb.ModelInferRequest)
    return infer_type.InferRequest.from_grpc(message)


def test_grpc_answers_only_the_outputs_asked_in_the_order_asked(kb) -> None:
    # kserve's gRPC writer answered every output, whatever the request asked for.
    arrays = {"y": np.ones((2, 3), np.float32), "k": np.array([3, -1]), "z": np.zeros(1)}
    response = oip.Response(tuple(oip.Tensor.from_array(k, v) for k, v in arrays.items()))
    asked = _grpc_request(("z", {}), ("k", {})).request_outputs
    answer = kb.infer_response(response, True, asked).to_grpc()
    assert [o.name for o in answer.outputs] == ["z", "k"]
    assert len(answer.raw_output_contents) == 2
    every = kb.infer_response(response, False, None).to_grpc()
    assert [o.name for o in every.outputs] == ["y", "k", "z"]


@pytest.mark.parametrize(
    ("output", "said"),
    [
        (("nope", {}), "No output named ['nope']; this model has ['y', 'k']."),
        (("y", {"classification": 3}), "classification extension is not supported"),
        (("y", {"binary_data": "false"}), "'binary_data' of output 'y' must be true or false"),
    ],
)
def test_grpc_refuses_what_rest_refuses_in_the_same_words(kb, output: tuple, said: str) -> None:
    # An unknown output was OK with every output; class_count was ignored.
    from pipeline.runtimes.kserve.fastpath import ClientError

    asked = _grpc_request(output).request_outputs
    with pytest.raises(ClientError) as err:
        kb.requested(asked, ["y", "k"])
    assert said in err.value.reason and err.value.status == 400
    response = oip.Response(tuple(oip.Tensor.from_array(n, np.ones(1)) for n in ("y", "k")))
    with pytest.raises(ClientError):
        kb.infer_response(response, False, asked)
