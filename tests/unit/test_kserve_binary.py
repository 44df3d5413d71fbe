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
