"""Inputs that disagree on a shared named axis are refused before any model runs.

AOTInductor's compiled code trusts its inputs: a `my_cell` package given x of
batch 2,000,000 and h of batch 1 segfaulted the worker, and TorchScript
broadcast (or failed with a 500). pl_codec checks every format's requests.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline_runtime import codec as pl_codec

CELL = [
    pl_codec.InputSpec("x", ("batch", 4), "float32"),
    pl_codec.InputSpec("h", ("batch", 4), "float32"),
]


def _cell(bx: int, bh: int) -> dict[str, np.ndarray]:
    return {"x": np.zeros((bx, 4), np.float32), "h": np.zeros((bh, 4), np.float32)}


@pytest.mark.parametrize(("bx", "bh"), [(1, 1), (7, 7)])
def test_inputs_agreeing_on_the_batch_pass(bx: int, bh: int) -> None:
    arrays, unbatched = pl_codec.check_arrays(_cell(bx, bh), CELL)
    assert arrays["x"].shape == (bx, 4)
    assert not unbatched


@pytest.mark.parametrize(("bx", "bh"), [(2_000_000 // 4, 1), (3, 2), (1, 2)])
def test_inputs_disagreeing_on_a_shared_axis_are_refused(bx: int, bh: int) -> None:
    with pytest.raises(pl_codec.RequestError, match="share the axis 'batch'") as err:
        pl_codec.check_arrays(_cell(bx, bh), CELL)
    assert err.value.status == 400
    assert f"got {bx} and {bh}" in str(err.value)
    assert [e["name"] for e in err.value.to_json()["expected"]] == ["x", "h"]


def test_a_json_request_with_mismatched_batches_is_a_400() -> None:
    body = json.dumps({"inputs": {"x": [[0.1] * 4] * 3, "h": [[0.2] * 4] * 2}}).encode()
    with pytest.raises(pl_codec.RequestError, match="'x' and 'h'"):
        pl_codec.decode_request(body, CELL, accepts_images=False)
