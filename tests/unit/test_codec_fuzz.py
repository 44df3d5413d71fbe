"""Hypothesis fuzzing of `pl_codec.decode_request`, aimed at the corners.

`test_codec_properties.py` holds the first, broad properties (random bytes,
any JSON value, v2 bodies, damaged PNGs, a float32 round trip). This file
pushes further into what those leave out:

1. Anything in → either arrays that obey the declared input spec (dtype, rank,
   fixed axes, finite, bounded size) and hold exactly the numbers that were
   sent, or `RequestError` with a 4xx status. Bodies that reach deep branches:
   magic-prefixed bytes, text, named inputs with unicode names, v2 items with
   hostile shapes (zeros, huge, > 64 axes) and names, .npy/.npz of any dtype
   and shape and damaged archives, an int64 model, odd scalars in the right shape.
2. Valid tensors round-trip exactly through every client encoding: JSON
   (`pipeline.serving.client.tensors_body`), KServe v2, .npy/.npz
   (`pipeline.serving.client.numpy_body`), with and without the batch axis.
3. PNG/JPEG images of any mode and size, truncated, bit-flipped or claiming a
   huge size, give a 4xx or a (1, 1, H, W) float32 image in [0, 1].
4. Any Content-Type (none, curl's form default, multipart, junk) with any body:
   what the gateway forwards (`pipeline.runtimes.torchserve.bodies`), handed over as
   TorchServe hands it, obeys 1.; valid tensors decode the same under every type.

Bounded and derandomized: the same examples on every run, a few seconds total.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile
import zlib
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from pipeline.runtimes.torchserve.bodies import FORWARDED_TYPES, BodyError, upstream_body
from pipeline.serving.client import numpy_body, tensors_body
from pipeline_runtime import codec as pl_codec

# An image claiming 1-2× the pixel limit makes PIL warn before pl_codec refuses it (413).
pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")

InputSpec = pl_codec.InputSpec
IMAGE = [InputSpec("image", ("batch", 1, 28, 28), "float32")]  # the digits CNN
CELL = [InputSpec("x", ("batch", 4), "float32"), InputSpec("h", ("batch", 4), "float32")]
TOKENS = [InputSpec("tokens", ("batch", 2), "int64")]  # an integer model: range checks
ONE = [CELL[0]]  # one small input: random .npy bodies often fit it
MODELS = [(IMAGE, True), (CELL, False), (TOKENS, False), (ONE, False)]
model_specs = st.sampled_from(MODELS)


def fuzz(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- the property every body must satisfy ------------------------------------------------


def refusal(
    body: Any, specs: list[InputSpec], accepts_images: bool
) -> pl_codec.Decoded | pl_codec.RequestError:
    """The decoded body, or the RequestError it was refused with (anything else raises)."""
    try:
        return pl_codec.decode_request(body, specs, accepts_images)
    except pl_codec.RequestError as err:
        return err


def decode(body: Any, specs: list[InputSpec], accepts_images: bool) -> pl_codec.Decoded | None:
    """Decode `body`; None for a refusal, which must be a JSON-able 4xx RequestError.

    Any other exception propagates and fails the test (it would be a 500).
    """
    error = refusal(body, specs, accepts_images)
    if isinstance(error, pl_codec.RequestError):
        assert isinstance(error.status, int) and 400 <= error.status <= 499, error.status
        json.dumps(error.to_json())  # the error answer itself must serialise
        return None
    decoded = error
    if decoded.protocol == "image":
        assert accepts_images
        (array,) = decoded.arrays.values()
        assert array.dtype == np.float32 and array.ndim == 4 and array.shape[:2] == (1, 1)
        assert 0 < array.size <= pl_codec.MAX_IMAGE_PIXELS
        assert ((array >= 0) & (array <= 1)).all()
        return decoded
    assert decoded.protocol in ("json", "v2", "npy", "npz")
    assert set(decoded.arrays) == {s.name for s in specs}
    for spec in specs:
        array = decoded.arrays[spec.name]
        assert array.dtype == np.dtype(spec.dtype), (spec, array.dtype)
        assert array.ndim == len(spec.shape)
        for got, want in zip(array.shape, spec.shape, strict=True):
            assert got >= 1 and (isinstance(want, str) or got == want), (array.shape, spec)
        assert 0 < array.size <= pl_codec.MAX_ELEMENTS
        assert array.flags.c_contiguous
        if array.dtype.kind == "f":
            assert np.isfinite(array).all()
    if decoded.unbatched:
        assert all(decoded.arrays[s.name].shape[0] == 1 for s in specs)
    return decoded


# --- strategies --------------------------------------------------------------------------

huge_ints = st.sampled_from(
    [2**31, -(2**31) - 1, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 10**30]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | huge_ints
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e300, -1e300, 3.5e38, 5e-324, -0.0])
    | st.text(max_size=6)
)
numbers = st.booleans() | st.integers(-(2**65), 2**65) | huge_ints | st.floats()
json_values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
    ),
    max_leaves=30,
)
names = st.sampled_from(
    ["image", "x", "h", "tokens", "X", "x ", "é", "图像", "", "\x00"]
) | st.text(max_size=4)
MAGIC = [
    b"",
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",
    b"\x93NUMPY",
    b"PK\x03\x04",
    b"{",
    b"[",
    b" \n",
]


def nest(flat: list[Any], dims: list[int]) -> Any:
    """A flat list as nested lists of shape `dims`."""
    if not dims:
        return flat[0]
    step = len(flat) // dims[0]
    return [nest(flat[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]


@st.composite
def spec_shaped(draw: st.DrawFn, spec: InputSpec, leaves: st.SearchStrategy) -> tuple:
    """Nested lists with exactly the spec's shape (batch 1-3 or left out), any leaves."""
    unbatched = draw(st.booleans())
    batch = 1 if unbatched else draw(st.integers(1, 3))
    dims = [batch if d == "batch" else int(d) for d in spec.shape]
    if unbatched:
        dims.pop(spec.shape.index("batch"))
    n = math.prod(dims)
    if n <= 16:
        flat = draw(st.lists(leaves, min_size=n, max_size=n))
    else:  # a 28×28 image: a few drawn values, tiled (keeps Hypothesis' buffer small)
        pool = draw(st.lists(leaves, min_size=1, max_size=8))
        flat = [pool[i % len(pool)] for i in range(n)]
    return nest(flat, dims), flat, unbatched


def expect_values(decoded: pl_codec.Decoded, spec: InputSpec, flat: list[Any]) -> None:
    """Accepted numbers are the numbers sent: exact for integers, float32-rounded for floats."""
    got = decoded.arrays[spec.name].reshape(-1)
    # true/false are not numbers: a float or integer input refuses them (no 1.0 and 0.0).
    assert not any(isinstance(v, bool) for v in flat), flat
    if spec.dtype == "int64":
        assert [int(v) for v in got] == [int(v) for v in flat]  # no silent wrap-around
        assert all(v == int(v) for v in flat)
    else:
        sent = np.array([float(v) for v in flat], dtype=np.float64)
        np.testing.assert_allclose(got, sent, rtol=1e-6, atol=1e-37)


# --- 1. anything in: a spec-conforming array or a 4xx --------------------------------------


@fuzz(250)
@given(st.sampled_from(MAGIC), st.binary(max_size=600), model_specs)
def test_bytes_with_any_prefix(prefix: bytes, tail: bytes, model: tuple) -> None:
    body = prefix + tail
    decode(body, *model)
    decode(bytearray(body), *model)  # TorchServe may hand over a bytearray


@fuzz(150)
@given(st.text(max_size=200), model_specs)
def test_any_text(text: str, model: tuple) -> None:
    decode(text, *model)
    decode(text.encode("utf-8", "surrogatepass"), *model)


@fuzz(250)
@given(json_values, st.lists(names, min_size=1, max_size=3, unique=True), model_specs)
def test_any_json_value_in_every_position(value: Any, keys: list[str], model: tuple) -> None:
    specs, images = model
    for body in ({"inputs": value}, {"inputs": dict.fromkeys(keys, value)}, value):
        decode(body, specs, images)  # pre-parsed, as TorchServe hands over JSON
        decode(json.dumps(body, allow_nan=True).encode(), specs, images)


@fuzz(60)
@given(st.integers(1, 3000), st.sampled_from(["[", "{", '{"a":', '{"inputs":[']), model_specs)
def test_deep_nesting(depth: int, opener: str, model: tuple) -> None:
    closer = {"[": "]", "{": "}", '{"a":': "}", '{"inputs":[': "]}"}[opener]
    decode((opener * depth + "1" + closer * depth).encode(), *model)
    value: Any = 1.0
    for _ in range(min(depth, 500)):
        value = [value]
    decode({"inputs": value}, *model)
    decode({"inputs": {s.name: value for s in model[0]}}, *model)


@fuzz(300)
@given(
    st.sampled_from([CELL, TOKENS, ONE]).flatmap(
        lambda specs: st.tuples(
            st.just(specs),
            st.tuples(*(spec_shaped(s, numbers | scalars) for s in specs)),
            st.booleans(),
        )
    )
)
def test_odd_numbers_in_the_right_shape(case: tuple) -> None:
    """Huge ints, ±Inf, NaN, 1e300, booleans, strings at the right places: exact or 4xx."""
    specs, drawn, named = case
    if named or len(specs) > 1:
        body: Any = {"inputs": {s.name: d[0] for s, d in zip(specs, drawn, strict=True)}}
    else:
        body = {"inputs": drawn[0][0]}
    for sent in (body, json.dumps(body, allow_nan=True).encode()):
        decoded = decode(sent, specs, False)
        if decoded is not None:
            for spec, (_, flat, _) in zip(specs, drawn, strict=True):
                expect_values(decoded, spec, flat)


@fuzz(50)
@given(spec_shaped(IMAGE[0], numbers))
def test_odd_numbers_in_an_image_tensor(drawn: tuple) -> None:
    nested, flat, unbatched = drawn
    decoded = decode({"inputs": nested}, IMAGE, True)
    if decoded is not None:
        assert decoded.unbatched == unbatched
        expect_values(decoded, IMAGE[0], flat)


dims = st.sampled_from([0, 1, 2, 4, 28, -1, 10**13, 2**63, 10**30]) | st.integers(-3, 30)
v2_shapes = (
    st.lists(dims, max_size=8)
    | st.lists(st.just(1), min_size=60, max_size=80)  # more axes than numpy allows
    | st.lists(st.booleans() | st.floats() | st.text(max_size=2), max_size=3)
    | json_values
)
v2_items = st.fixed_dictionaries(
    {},
    optional={
        "name": names | st.integers() | st.none() | st.lists(st.integers(), max_size=2),
        "shape": v2_shapes,
        "datatype": st.sampled_from(["FP32", "INT64", "FP64", "FP16", "BOOL", "BYTES", "fp32"])
        | st.text(max_size=4)
        | st.none(),
        "data": st.lists(numbers, max_size=40) | json_values,
        "parameters": json_values,
    },
)


@fuzz(300)
@given(st.lists(v2_items | json_values, min_size=1, max_size=3), model_specs)
def test_hostile_v2_bodies(items: list, model: tuple) -> None:
    decode({"inputs": items}, *model)
    decode(json.dumps({"inputs": items}, allow_nan=True).encode(), *model)


@fuzz(150)
@given(st.sampled_from([CELL, TOKENS, ONE]), st.data())
def test_v2_bodies_with_matching_names(specs: list, data: st.DataObject) -> None:
    """Right names and datatype, so shape and data checks are what is exercised."""
    batch = data.draw(st.integers(0, 3))  # 0: the batch axis left out
    near = [batch if d == "batch" else int(d) for d in specs[0].shape if d != "batch" or batch]
    shape = data.draw(
        st.just(near)
        | st.lists(dims, min_size=1, max_size=4)
        | st.lists(st.just(1), min_size=60, max_size=80)  # more axes than numpy allows
    )
    size = math.prod(shape) if all(isinstance(d, int) and 0 <= d <= 12 for d in shape) else 0
    exact = data.draw(st.integers(0, 3)) > 0  # mostly as many values as the shape says
    leaves = st.integers(-100, 100) | st.floats(-1e6, 1e6) | numbers
    values = data.draw(
        st.lists(leaves, min_size=size, max_size=size) if exact else st.lists(leaves, max_size=12)
    )
    datatype = {"float32": "FP32", "int64": "INT64"}[specs[0].dtype]
    items = [{"name": s.name, "shape": shape, "datatype": datatype, "data": values} for s in specs]
    decoded = decode({"inputs": items}, specs, False)
    if decoded is not None:
        for spec in specs:
            expect_values(decoded, spec, values)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _npz(arrays: dict[str, np.ndarray], method: int = zipfile.ZIP_STORED) -> bytes:
    """What np.savez writes (one NAME.npy per array), with any zip compression method."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, array in arrays.items():
            zf.writestr(f"{name}.npy", _npy(array))
    return buf.getvalue()


ZIP_METHODS = [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]


DTYPES = ["<f4", ">f4", "<f8", "<f2", "<i8", "<i4", "u1", "?", "<c8", "<U3"]


@st.composite
def arrays_for(draw: st.DrawFn, spec: InputSpec) -> np.ndarray:
    """Any dtype and shape, but often the spec's own (batch 1-3, or no batch axis)."""
    dtype = draw(st.just(spec.dtype) | st.sampled_from(DTYPES))
    batch = draw(st.integers(0, 3))  # 0: the batch axis left out
    near = tuple(batch if d == "batch" else int(d) for d in spec.shape if d != "batch" or batch)
    shape = draw(st.just(near) | hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=5))
    return draw(hnp.arrays(dtype, shape))


@fuzz(200)
@given(model_specs, st.data())
def test_npy_of_any_dtype_and_shape(model: tuple, data: st.DataObject) -> None:
    specs, _ = model
    array = data.draw(arrays_for(specs[0]))
    decoded = decode(_npy(array), *model)
    if decoded is not None:  # accepted: the very same numbers, maybe with a batch axis added
        np.testing.assert_array_equal(decoded.arrays[specs[0].name].reshape(array.shape), array)


member_names = (st.sampled_from(["x", "h", "tokens"]) | names | st.just("x.npy")).filter(
    lambda n: "\x00" not in n  # zipfile cuts a name at NUL
)


@fuzz(150)
@given(model_specs, st.sampled_from(ZIP_METHODS), st.data())
def test_npz_with_any_names(model: tuple, method: int, data: st.DataObject) -> None:
    specs, _ = model
    keys = data.draw(
        st.just([s.name for s in specs])
        | st.lists(member_names, min_size=1, max_size=3, unique=True)
    )
    by_name = {s.name: s for s in specs}
    arrays = {k: data.draw(arrays_for(by_name.get(k, specs[0]))) for k in keys}
    decoded = decode(_npz(arrays, method), *model)
    if decoded is not None:  # accepted: the very same numbers, maybe with a batch axis added
        for name, array in arrays.items():
            np.testing.assert_array_equal(decoded.arrays[name].reshape(array.shape), array)


def _damage(data: bytes, cut: int, flips: list[tuple[int, int]]) -> list[bytes]:
    """`data` cut short, and with some bytes XOR-ed (never a no-op flip)."""
    corrupted = bytearray(data)
    for where, mask in flips:
        corrupted[where % len(data)] ^= mask
    return [data[: cut % (len(data) + 1)], bytes(corrupted)]


flips = st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4)
CELL_ARRAYS = {"x": np.ones((2, 4), np.float32), "h": np.zeros((2, 4), np.float32)}
VALID_NUMPY = [
    (_npy(np.ones((2, 4), np.float32)), ONE),
    (_npy(np.arange(784, dtype=np.float32).reshape(1, 1, 28, 28) / 784), IMAGE),
    *((_npz(CELL_ARRAYS, method), CELL) for method in ZIP_METHODS),
]


@fuzz(300)
@given(st.sampled_from(VALID_NUMPY), st.integers(0, 10**6), flips)
def test_damaged_npy_and_npz(case: tuple, cut: int, flipped: list) -> None:
    body, specs = case
    assert decode(body, specs, False) is not None  # intact, it is accepted
    for damaged in _damage(body, cut, flipped):
        decode(damaged, specs, False)


# --- 2. valid tensors round-trip exactly through every client encoding ----------------------

float32s = st.floats(width=32, allow_nan=False, allow_infinity=False)
int64s = st.integers(-(2**63), 2**63 - 1)
int64_edges = st.sampled_from([2**63 - 1, -(2**63), 2**53 + 1, 2**31, -(2**31) - 1])


def _v2_body(inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    datatype = {torch.float32: "FP32", torch.int64: "INT64"}
    return {
        "inputs": [
            {
                "name": k,
                "shape": list(v.shape),
                "datatype": datatype[v.dtype],
                "data": v.reshape(-1).tolist(),
            }
            for k, v in inputs.items()
        ]
    }


@st.composite
def valid_inputs(draw: st.DrawFn) -> tuple[list[InputSpec], dict[str, torch.Tensor], bool]:
    specs = draw(st.sampled_from([IMAGE, CELL, TOKENS]))
    unbatched = draw(st.booleans())
    batch = draw(st.integers(1, 3))
    inputs = {}
    for spec in specs:
        shape = [batch if d == "batch" else int(d) for d in spec.shape]
        if spec.dtype == "int64":
            array = draw(hnp.arrays(np.int64, shape, elements=int64s | int64_edges))
        else:
            array = draw(hnp.arrays(np.float32, shape, elements=float32s))
        inputs[spec.name] = torch.from_numpy(array[0] if unbatched else array)
    return specs, inputs, unbatched


@fuzz(60)
@given(valid_inputs())
def test_valid_tensors_round_trip(case: tuple) -> None:
    specs, inputs, unbatched = case
    bodies = {
        "json": tensors_body(inputs),
        "v2": json.dumps(_v2_body(inputs)).encode(),
        "npy" if len(inputs) == 1 else "npz": numpy_body(inputs),
    }
    if len(inputs) == 1:  # a one-input model also takes the tensor without a name
        bodies["plain"] = json.dumps({"inputs": next(iter(inputs.values())).tolist()}).encode()
    for how, body in bodies.items():
        for sent in (body, json.loads(body) if how in ("json", "v2", "plain") else body):
            decoded = pl_codec.decode_request(sent, specs, accepts_images=specs is IMAGE)
            assert decoded.unbatched == unbatched, how
            for name, tensor in inputs.items():
                want = tensor.numpy()[None] if unbatched else tensor.numpy()
                got = decoded.arrays[name]
                assert got.dtype == want.dtype, how
                np.testing.assert_array_equal(got, want, err_msg=how)  # exact, not close


# --- 3. images: any mode and size, damaged or lying about their size ----------------------

PNG_MODES = ["L", "RGB", "RGBA", "P", "1", "LA", "I;16"]


@st.composite
def images(draw: st.DrawFn) -> tuple[bytes, tuple[int, int]]:
    fmt = draw(st.sampled_from(["PNG", "JPEG"]))
    modes = ["L", "RGB", "CMYK"] if fmt == "JPEG" else PNG_MODES
    mode = draw(st.sampled_from(modes))
    width, height = draw(st.integers(1, 48)), draw(st.integers(1, 48))
    seed = draw(st.integers(0, 2**32 - 1))
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width), dtype=np.uint8)
    image = Image.fromarray(pixels, "L").convert(mode)
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue(), (height, width)


@fuzz(150)
@given(images(), st.integers(0, 10**6), flips)
def test_damaged_images(case: tuple, cut: int, flipped: list) -> None:
    data, (height, width) = case
    intact = decode(data, IMAGE, True)
    assert intact is not None and intact.arrays["image"].shape == (1, 1, height, width)
    refused = decode(data, CELL, False)  # a model that takes no images
    assert refused is None
    for damaged in _damage(data, cut, flipped):
        decode(damaged, IMAGE, True)


def _png_claiming(width: int, height: int, bit_depth: int, color: int) -> bytes:
    """A PNG whose header claims a size (valid CRCs) but holds 64 bytes of pixels."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload)
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, bit_depth, color, 0, 0, 0)
    pixels = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


@fuzz(100)
@given(
    st.integers(1, 2**31 - 1) | st.sampled_from([4096, 4097, 5793, 8192, 30000]),
    st.integers(1, 2**31 - 1) | st.sampled_from([1, 4096, 4097, 5793, 8192]),
    st.sampled_from([(8, 0), (16, 0), (8, 2), (16, 6), (1, 0)]),
)
def test_images_claiming_a_huge_size(width: int, height: int, depth_color: tuple) -> None:
    outcome = refusal(_png_claiming(width, height, *depth_color), IMAGE, True)
    if width * height > pl_codec.MAX_IMAGE_PIXELS:
        assert isinstance(outcome, pl_codec.RequestError), (width, height)
        assert outcome.status == 413, (width, height, str(outcome))
    elif isinstance(outcome, pl_codec.RequestError):
        assert 400 <= outcome.status <= 499
    else:  # PIL pads a short pixel stream; the size stays what the header claimed
        assert outcome.arrays["image"].shape == (1, 1, height, width)


# --- 4. any Content-Type: what the gateway forwards, as TorchServe hands it over ----------


def torchserve_handoff(body: bytes, media: str) -> Any:
    """What TorchServe 0.12 hands the handler for a raw body of this media type (measured, and
    `ts.protocol.otf_message_handler._retrieve_input_data`): JSON parsed when it parses (else
    the bytes), every other type the gateway forwards as a bytearray."""
    if media == "application/json":
        try:
            return json.loads(body.decode("utf-8"))
        except Exception:  # noqa: BLE001 - TorchServe falls back to the bytes on any failure
            return bytearray(body)
    return bytearray(body)


content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/x-www-form-urlencoded",
            "application/x-www-form-urlencoded; charset=utf-16",
            "multipart/form-data; boundary=x",
            "multipart/form-data",
            "application/json; charset=nonexistent",
            "application/octet-stream",
            "image/png",
            "image/gif",
            "text/plain",
            "",
        ]
    ),
    st.text(max_size=30),
)


@fuzz(250)
@given(content_types, st.sampled_from([*MAGIC, b"--x\r\n", b"a=%zz&"]), st.binary(max_size=400),
       model_specs)  # fmt: skip
def test_any_content_type_through_the_gateway(
    declared: str | None, prefix: bytes, tail: bytes, model: tuple
) -> None:
    """The gateway answers 400 itself or forwards one of four media types; whatever TorchServe
    then hands the handler decodes to spec-conforming arrays or a 4xx, never anything else."""
    try:
        body, media = upstream_body(declared, prefix + tail)
    except BodyError:
        return  # the gateway's own 400
    assert media in FORWARDED_TYPES
    decode(torchserve_handoff(body, media), *model)


def test_valid_bodies_decode_the_same_whatever_the_content_type() -> None:
    x = torch.rand(2, 4)
    for body in (tensors_body({"x": x}), numpy_body({"x": x})):
        for declared in (None, "", "application/x-www-form-urlencoded", "text/plain", "image/png"):
            forwarded, media = upstream_body(declared, body)
            decoded = pl_codec.decode_request(torchserve_handoff(forwarded, media), ONE, False)
            np.testing.assert_array_equal(decoded.arrays["x"], x.numpy())
