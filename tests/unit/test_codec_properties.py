"""Property-based fuzzing (Hypothesis) of the handlers' request decoding.

Whatever arrives, `decode_request` either returns arrays that match the
model's declared inputs or raises `RequestError` with a 4xx status: no other
exception may escape (it would become a 500, or kill the worker).
Derandomized, so CI sees the same examples every run.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from pipeline.serving.client import tensors_body
from pipeline_runtime import codec as pl_codec

IMAGE = [pl_codec.InputSpec("image", ("batch", 1, 28, 28), "float32")]
CELL = [
    pl_codec.InputSpec("x", ("batch", 4), "float32"),
    pl_codec.InputSpec("h", ("batch", 4), "float32"),
]
SPECS = st.sampled_from([(IMAGE, True), (CELL, False)])
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Any JSON value: numbers of every kind (huge, negative, NaN/Inf), unicode
# strings and keys, nested lists and objects.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=40,
)
v2_items = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["image", "x", "h", "é", ""]),
        "shape": st.lists(st.integers(min_value=-5, max_value=10**13), max_size=5),
        "datatype": st.sampled_from(["FP32", "FP64", "INT64", "BYTES", "fp32", ""]),
        "data": st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=40),
    }
)


def _check(body: Any, specs: list, accepts_images: bool) -> None:
    try:
        decoded = pl_codec.decode_request(body, specs, accepts_images)
    except pl_codec.RequestError as err:
        status, answer = err.status, err.to_json()
    else:
        status, answer = 200, None
    if status != 200:
        assert 400 <= status < 500, status
        json.dumps(answer)  # the answer itself must serialise
        return
    if decoded.protocol == "image":
        # Any size and mode: grayscale in [0, 1]; the handler resizes it as training did.
        (array,) = decoded.arrays.values()
        assert array.dtype == np.float32 and array.ndim == 4 and array.shape[:2] == (1, 1)
        assert ((array >= 0) & (array <= 1)).all()
        return
    for spec in specs:
        array = decoded.arrays[spec.name]
        assert array.dtype == np.dtype(spec.dtype)
        assert array.ndim == len(spec.shape)
        assert all(
            isinstance(want, str) or got == want
            for got, want in zip(array.shape, spec.shape, strict=True)
        )
        assert np.isfinite(array).all()


@FUZZ
@given(st.binary(max_size=2048), SPECS)
def test_random_bytes(body: bytes, spec: tuple) -> None:
    _check(body, *spec)


@FUZZ
@given(json_values, SPECS)
def test_any_json_value_as_the_body(value: Any, spec: tuple) -> None:
    _check(json.dumps(value, allow_nan=True).encode(), *spec)
    _check({"inputs": value}, *spec)  # as TorchServe's worker hands over a pre-parsed body


@FUZZ
@given(st.lists(v2_items, max_size=3), SPECS)
def test_open_inference_protocol_bodies(items: list, spec: tuple) -> None:
    _check(json.dumps({"inputs": items}).encode(), *spec)


@FUZZ
@given(st.integers(min_value=1, max_value=4), st.data())
def test_valid_tensors_round_trip(batch: int, data: st.DataObject) -> None:
    floats = st.floats(min_value=-1e6, max_value=1e6, width=32)
    x = np.array(data.draw(st.lists(floats, min_size=4 * batch, max_size=4 * batch)), np.float32)
    h = np.array(data.draw(st.lists(floats, min_size=4 * batch, max_size=4 * batch)), np.float32)
    import torch

    inputs = {
        "x": torch.from_numpy(x.reshape(batch, 4)),
        "h": torch.from_numpy(h.reshape(batch, 4)),
    }
    decoded = pl_codec.decode_request(tensors_body(inputs), CELL, False)
    for name, tensor in inputs.items():
        np.testing.assert_array_equal(
            decoded.arrays[name], tensor.numpy()
        )  # exact: repr round-trips
    v2 = {
        "inputs": [
            {"name": k, "shape": [batch, 4], "datatype": "FP32", "data": v.flatten().tolist()}
            for k, v in inputs.items()
        ]
    }
    decoded = pl_codec.decode_request(json.dumps(v2).encode(), CELL, False)
    assert decoded.protocol == "v2"
    for name, tensor in inputs.items():
        np.testing.assert_array_equal(decoded.arrays[name], tensor.numpy())


def _png(size: tuple[int, int], mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color=0).save(buf, "PNG")
    return buf.getvalue()


PNGS = [_png((28, 28), "L"), _png((40, 17), "RGB"), _png((5, 5), "RGBA")]


@FUZZ
@given(st.sampled_from(PNGS), st.integers(min_value=0, max_value=400), st.integers(0, 255))
def test_truncated_or_bit_flipped_images(png: bytes, cut: int, flip: int) -> None:
    truncated = png[: min(cut, len(png))]
    _check(truncated, IMAGE, True)
    corrupted = bytearray(png)
    corrupted[min(cut, len(png) - 1)] ^= flip
    _check(bytes(corrupted), IMAGE, True)


def test_the_fuzzers_reach_both_outcomes() -> None:
    """A fuzzer that only ever produced errors would prove little."""
    assert pl_codec.decode_request(_png((28, 28), "L"), IMAGE, True).protocol == "image"
    ok = pl_codec.decode_request(json.dumps({"inputs": [[0.5] * 4]}).encode(), CELL[:1], False)
    assert ok.arrays["x"].shape == (1, 4)
    assert not math.isnan(float(ok.arrays["x"][0, 0]))
