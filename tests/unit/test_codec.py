"""The handlers' request decoding, without TorchServe (pure functions)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from pipeline_runtime import codec as pl_codec

IMAGE = [pl_codec.InputSpec("image", ("batch", 1, 28, 28), "float32")]
CELL = [
    pl_codec.InputSpec("x", ("batch", 4), "float32"),
    pl_codec.InputSpec("h", ("batch", 4), "float32"),
]
SEQ = [pl_codec.InputSpec("xs", ("seq", "batch", 4), "float32")]


def test_plain_and_named_json() -> None:
    d = pl_codec.decode_request(
        {"inputs": np.zeros((2, 1, 28, 28)).tolist()}, IMAGE, accepts_images=True
    )
    assert d.arrays["image"].shape == (2, 1, 28, 28)
    assert d.arrays["image"].dtype == np.float32
    assert not d.unbatched
    d = pl_codec.decode_request(
        json.dumps({"inputs": {"h": [0.0] * 4, "x": [1.0] * 4}}).encode(), CELL, False
    )
    assert d.arrays["x"].shape == (1, 4)
    assert d.unbatched  # one sample without its batch axis


def test_sequence_batch_axis_is_not_first() -> None:
    d = pl_codec.decode_request({"inputs": np.ones((5, 4)).tolist()}, SEQ, False)
    assert d.arrays["xs"].shape == (5, 1, 4)


def test_open_inference_protocol() -> None:
    body = {
        "inputs": [
            {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": list(range(8))},
            {"name": "h", "shape": [2, 4], "datatype": "FP32", "data": [0] * 8},
        ]
    }
    d = pl_codec.decode_request(body, CELL, False)
    assert d.protocol == "v2"
    assert d.arrays["x"][1].tolist() == [4, 5, 6, 7]
    out = pl_codec.encode_outputs(["y"], [np.ones((2, 3), np.float32)], "v2", "m", False)
    assert out["outputs"][0] == {
        "name": "y",
        "shape": [2, 3],
        "datatype": "FP32",
        "data": [1.0] * 6,
    }


def test_image_bytes() -> None:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8), 255, np.uint8)).save(buf, format="PNG")
    d = pl_codec.decode_request(buf.getvalue(), IMAGE, accepts_images=True)
    assert d.protocol == "image"
    assert d.arrays["image"].shape == (1, 1, 8, 8)  # the handler resizes with torch
    assert float(d.arrays["image"].max()) == 1.0
    with pytest.raises(pl_codec.RequestError, match="does not take images") as err:
        pl_codec.decode_request(buf.getvalue(), CELL, accepts_images=False)
    assert err.value.status == 415


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"", 400, "Empty request body"),
        (None, 400, "Empty request body"),
        (b"\xff\xfe\x00garbage", 415, "neither UTF-8 JSON"),
        (b"hello", 415, 'not JSON (it does not start with "{" or "["), nor a NumPy'),
        (b"null", 400, "'inputs' field"),  # JSON (it said "not JSON", 415), no request
        (b" 3 ", 400, "'inputs' field"),
        (b'"inputs"', 400, "'inputs' field"),
        (b'{"inputs": [1, 2', 400, "Malformed JSON"),
        (b'{"inputs": [NaN]}', 400, "Malformed JSON"),
        ({"instances": []}, 400, "'inputs' field"),
        ({"inputs": "abc"}, 400, "(nested) list of numbers"),
        ({"inputs": [[1, 2], [3]]}, 400, "rectangular"),
        ({"inputs": np.zeros((1, 3, 28, 28)).tolist()}, 400, "must have shape"),
        ({"inputs": np.full((1, 1, 28, 28), np.inf).tolist()}, 400, "NaN or Inf"),
        ({"inputs": {"image": [1.0]}}, 400, "must have shape"),
        ({"inputs": {"img": [1.0]}}, 400, "must be named"),
        ({"inputs": [{"name": "image", "shape": [-1], "datatype": "FP32", "data": []}]}, 400, "negative or too large"),
        ({"inputs": [{"name": "image", "shape": [10**9, 10**9], "datatype": "FP32", "data": [1]}]}, 400, "too large"),
        ({"inputs": [{"name": "image", "shape": [2], "datatype": "FP32", "data": [1]}]}, 400, "must hold 2 values"),
        ({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}, 400, "datatype must be FP32"),
        (b"\x89PNG\r\n\x1a\n" + b"junk" * 10, 400, "cannot be decoded"),
    ],
)  # fmt: skip
def test_bad_bodies(body: object, status: int, fragment: str) -> None:
    with pytest.raises(pl_codec.RequestError) as err:
        pl_codec.decode_request(body, IMAGE, accepts_images=True)
    assert err.value.status == status
    assert fragment in str(err.value)
    assert json.dumps(err.value.to_json())  # always a JSON answer


def test_deep_nesting_is_refused() -> None:
    deep = "[" * 5000 + "1" + "]" * 5000
    with pytest.raises(pl_codec.RequestError, match=r"nested too deeply|Malformed"):
        pl_codec.decode_request(('{"inputs": ' + deep + "}").encode(), IMAGE, accepts_images=True)


def test_topk() -> None:
    out = pl_codec.encode_outputs(
        ["logits"], [np.array([[0.0, 2.0, 1.0]], np.float32)], "json", "m", False, topk=2
    )
    assert [t["class"] for t in out["topk"][0]] == [1, 2]
    assert sum(t["probability"] for t in out["topk"][0]) < 1.0


def test_one_image_sent_without_its_batch_axis_keeps_its_detections_whole() -> None:
    # Per-sample fields hold the image's rows along the detections axis: the first row of
    # each was answered (one box of 3, counts 3), and an image with none raised IndexError.
    names = ["boxes", "scores", "counts"]
    fields = ("boxes", "scores")
    three = [np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(3, np.float32), np.array([3])]
    out = pl_codec.encode_outputs(names, three, "json", "m", True, per_sample=fields)["outputs"]
    assert np.array(out["boxes"]).shape == (3, 4) and out["counts"] == 3
    none = [np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.array([0])]
    body = pl_codec.encode_outputs(names, none, "v2", "m", True, per_sample=fields)
    assert [o["shape"] for o in body["outputs"]] == [[0, 4], [0], []]
    # Not a detector: the first (only) row of each, as before.
    plain = pl_codec.encode_outputs(["y"], [np.ones((1, 2), np.float32)], "json", "m", True)
    assert plain["outputs"]["y"] == [1.0, 1.0]


def test_image_bomb_and_type_confusion() -> None:
    bomb = bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200007530000075300800000000434ca7660000000c"
        "49444154789c6360a03d00000064000186643c350000000049454e44ae426082"
    )
    with pytest.raises(pl_codec.RequestError, match="4096") as err:
        pl_codec.decode_request(bomb, IMAGE, accepts_images=True)
    assert err.value.status == 413
    ints = [pl_codec.InputSpec("tokens", ("batch", 2), "int64")]
    with pytest.raises(pl_codec.RequestError, match="fractional"):
        pl_codec.decode_request({"inputs": [[1.7, 2.0]]}, ints, False)
    assert (
        pl_codec.decode_request({"inputs": [[1.0, 2.0]]}, ints, False).arrays["tokens"].dtype
        == np.int64
    )
    with pytest.raises(pl_codec.RequestError, match="float32"):
        pl_codec.decode_request({"inputs": [["1.5", "2"]]}, CELL[:1], False)


def test_input_without_batch_axis_does_not_force_batched_flag() -> None:
    specs = [
        pl_codec.InputSpec("x", ("batch", 3), "float32"),
        pl_codec.InputSpec("scale", (1,), "float32"),
    ]
    d = pl_codec.decode_request({"inputs": {"x": [1.0, 2.0, 3.0], "scale": [2.0]}}, specs, False)
    assert d.unbatched
    assert d.arrays["x"].shape == (1, 3)
    assert d.arrays["scale"].shape == (1,)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def test_numpy_binary_bodies() -> None:
    image = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    d = pl_codec.decode_request(_npy(image), IMAGE, accepts_images=True)
    assert d.protocol == "npy"
    np.testing.assert_array_equal(d.arrays["image"], image)
    buf = io.BytesIO()
    x, h = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    np.savez(buf, x=x, h=h)
    d = pl_codec.decode_request(buf.getvalue(), CELL, False)
    assert d.protocol == "npz"
    np.testing.assert_array_equal(d.arrays["x"], x)
    np.testing.assert_array_equal(d.arrays["h"], h)
    one = pl_codec.decode_request(_npy(x[0]), CELL[:1], False)
    assert one.unbatched and one.arrays["x"].shape == (1, 4)
    # Big-endian float32 ('>f4') was refused, "must be float32, got >f4": the same numbers.
    swapped = pl_codec.decode_request(_npy(image.astype(">f4")), IMAGE, accepts_images=True)
    assert swapped.arrays["image"].dtype == np.dtype("float32")  # this machine's order
    np.testing.assert_array_equal(swapped.arrays["image"], image)


@pytest.mark.parametrize(
    ("body", "specs", "fragment"),
    [
        (_npy(np.zeros((1, 1, 28, 28), np.float64)), IMAGE, "must be float32, got float64"),
        (_npy(np.zeros((1, 1, 27, 28), np.float32)), IMAGE, "must have shape"),
        (_npy(np.full((1, 4), np.nan, np.float32)), CELL[:1], "NaN or Inf"),
        (_npy(np.array([{"a": 1}], dtype=object)), CELL[:1], "not a readable .npy"),
        (b"\x93NUMPY\x01\x00garbage", IMAGE, "not a readable .npy"),
        (_npy(np.zeros((1, 4), np.float32)), CELL, "send an .npz"),
        (b"PK\x03\x04" + b"\x00" * 40, CELL, "not a readable .npz"),
    ],
)
def test_bad_numpy_bodies(body: bytes, specs: list, fragment: str) -> None:
    with pytest.raises(pl_codec.RequestError, match=fragment) as err:
        pl_codec.decode_request(body, specs, accepts_images=False)
    assert err.value.status == 400


def test_npz_with_wrong_names_or_a_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import zipfile

    from pipeline_runtime import binary

    # A small limit, where the .npz reader reads it: a small bomb will do.
    monkeypatch.setattr(binary, "MAX_ELEMENTS", 1000)
    monkeypatch.setattr(pl_codec, "MAX_ELEMENTS", 1000)

    buf = io.BytesIO()
    np.savez(buf, x=np.ones((1, 4), np.float32))
    with pytest.raises(pl_codec.RequestError, match="named"):
        pl_codec.decode_request(buf.getvalue(), CELL, False)
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", b"\x00" * (pl_codec.MAX_ELEMENTS * 8 + 10_000))
        zf.writestr("h.npy", _npy(np.ones((1, 4), np.float32)))
    with pytest.raises(pl_codec.RequestError, match="too large") as err:
        pl_codec.decode_request(bomb.getvalue(), CELL, False)
    assert err.value.status == 413


TOKENS = [pl_codec.InputSpec("tokens", ("batch", "seq"), "int64", 0.0, 1000.0, bounded=True)]


@pytest.mark.parametrize(("token", "said"), [(5000, "holds 5000"), (-1, "holds -1")])
def test_a_token_past_the_declared_vocabulary_is_refused_before_the_model(
    token: int, said: str
) -> None:
    """A user's trial: 5000 failed ONNX Runtime's Gather (a 500 that failed the requests
    stacked with it), -1 wrapped round to the last row (a silent wrong answer), and a
    compiled .pt2 aborted its worker process ("index out of bounds: 0 <= tmp2 < 1000")."""
    body = {
        "inputs": [{"name": "tokens", "shape": [1, 2], "datatype": "INT64", "data": [token, 1]}]
    }
    with pytest.raises(pl_codec.RequestError, match=said) as err:
        pl_codec.decode_request(body, TOKENS, False)
    assert err.value.status == 400 and "must be in 0..999" in str(err.value)
    assert err.value.expected["high"] == 1000
    ok = {"inputs": [{"name": "tokens", "shape": [1, 2], "datatype": "INT64", "data": [0, 999]}]}
    assert pl_codec.decode_request(ok, TOKENS, False).arrays["tokens"].tolist() == [[0, 999]]
    # Only a declared range bounds: an integer input's default sampling range does not.
    free = [pl_codec.InputSpec("tokens", ("batch", "seq"), "int64", 0.0, 10.0)]
    assert pl_codec.decode_request(body, free, False).arrays["tokens"].tolist() == [[token, 1]]


def test_true_and_false_are_not_numbers_nor_five_a_bool() -> None:
    """numpy reads true/false as 1/0 and 5 as True; a request is refused instead, over the
    handlers' JSON and the Open Inference Protocol's alike (Triton refuses them too)."""
    ints = [pl_codec.InputSpec("tokens", ("batch", 2), "int64")]
    mask = [pl_codec.InputSpec("mask", ("batch", 2), "bool")]

    def oip(datatype: str, data: list) -> dict:
        return {"inputs": [{"name": "x", "shape": [1, 2], "datatype": datatype, "data": data}]}

    refused = [
        ({"inputs": [[True, False]]}, CELL[:1], "send numbers, not true/false"),
        ({"inputs": [[True, 0.5]]}, CELL[:1], "send numbers, not true/false"),  # a mix too
        ({"inputs": [[1, False]]}, ints, "send numbers, not true/false"),
        (oip("FP32", [True, False]), CELL[:1], "send numbers, not true/false"),
        ({"inputs": [[5, 0]]}, mask, "send true/false"),
    ]
    for body, specs, fragment in refused:
        with pytest.raises(pl_codec.RequestError, match=fragment) as err:
            pl_codec.decode_request(body, specs, False)
        assert err.value.status == 400
        with pytest.raises(pl_codec.RequestError, match=fragment):  # the same as bytes
            pl_codec.decode_request(json.dumps(body).encode(), specs, False)
    for sent in ([[True, False]], [[1, 0]]):
        got = pl_codec.decode_request({"inputs": sent}, mask, False).arrays["mask"]
        assert got.dtype == np.bool_ and got.tolist() == [[True, False]]


def test_the_by_name_hint_is_the_json_to_send() -> None:
    # It read {"inputs": {'x', 'h': ...}}: a Python set and dict, in single quotes.
    with pytest.raises(pl_codec.RequestError) as err:
        pl_codec.decode_request({"inputs": [[1.0] * 4]}, CELL, False)
    assert str(err.value).endswith('send them by name: {"inputs": {"x": [...], "h": [...]}}.')
