"""Bounded work per request: .npy/.npz headers are checked before any array is allocated.

A compressed .npz of zeros is tiny on the wire and huge in memory (a 305 KB
one declared 78 million float32 values, and a 30 KB one 10,000 digits
images); the checks here read only each array's header (`numpy.lib.format`)
and refuse what is over `Limits` or `MAX_ELEMENTS` with a 413, and pickled
object arrays with a 400, before anything is inflated or unpickled.
"""

from __future__ import annotations

import io
import pickle
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_runtime import codec as pl_codec
from pipeline_runtime.request import Limits, check_shapes, sniff

IMAGE = [pl_codec.InputSpec("image", ("batch", 1, 28, 28), "float32")]
CELL = [
    pl_codec.InputSpec("x", ("batch", 4), "float32"),
    pl_codec.InputSpec("h", ("batch", 4), "float32"),
]
DIGITS_LIMITS = Limits(max_samples=256)  # 32 × the archive's default batch size of 8


def npy_header(
    shape: tuple[int, ...], descr: str = "<f4", version: tuple[int, int] = (1, 0)
) -> bytes:
    buf = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(buf, header)
    else:
        np.lib.format.write_array_header_2_0(buf, header)
    return buf.getvalue()


def zeros_npz(members: dict[str, tuple[int, ...]]) -> bytes:
    """An .npz whose arrays are zeros of these shapes, deflated as it is written (no big buffer)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, shape in members.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fp:
                fp.write(npy_header(shape))
                left, chunk = int(np.prod(shape)) * 4, b"\0" * (1 << 20)
                while left > 0:
                    fp.write(chunk[: min(left, len(chunk))])
                    left -= len(chunk)
    return buf.getvalue()


def refused(body: bytes, specs: list, limits: Limits | None = None) -> pl_codec.RequestError:
    with pytest.raises(pl_codec.RequestError) as err:
        pl_codec.decode_request(body, specs, accepts_images=False, limits=limits)
    return err.value


def test_sniff_recognises_bodies_by_their_first_bytes() -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
    assert sniff(png) == "png"
    assert sniff(b"\xff\xd8\xff\xe0") == "jpeg"
    assert sniff(npy_header((1, 4))) == "npy"
    assert sniff(zeros_npz({"x": (1, 4)})) == "npz"
    for text in (b'{"inputs": []}', b"  \n\t[1, 2]", b"{"):
        assert sniff(text) == "json", text
    for other in (b"", b"hello", b"a=%zz", b"\xef\xbb\xbf{}", b"GIF89a", b"P", b"\x93NUMP"):
        assert sniff(other) is None, other


def test_an_npz_bomb_is_refused_from_its_header_without_allocating_it() -> None:
    """The issue's bomb: 305 KB on the wire, 78,400,000 float32 values (314 MB) declared."""
    bomb = zeros_npz({"image": (100_000, 1, 28, 28)})
    assert len(bomb) < 400_000
    tracemalloc.start()
    try:
        err = refused(bomb, IMAGE, DIGITS_LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.status == 413
    assert "78400000 values" in str(err)
    assert peak < 5 * 2**20, f"refusing it allocated {peak / 2**20:.0f} MiB"


def test_ten_thousand_samples_in_30_kb_are_refused_before_they_are_read() -> None:
    body = zeros_npz({"image": (10_000, 1, 28, 28)})
    assert len(body) < 40_000
    tracemalloc.start()
    try:
        err = refused(body, IMAGE, DIGITS_LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.status == 413
    assert "10000 samples" in str(err) and "at most 256" in str(err)
    assert peak < 5 * 2**20
    # At the limit it is served; without limits (the codec's default) too.
    ok = pl_codec.decode_request(
        zeros_npz({"image": (256, 1, 28, 28)}), IMAGE, False, DIGITS_LIMITS
    )
    assert ok.arrays["image"].shape == (256, 1, 28, 28)
    assert pl_codec.decode_request(body, IMAGE, False).arrays["image"].shape[0] == 10_000


def test_the_sample_limit_holds_for_every_encoding_and_batch_axis() -> None:
    limits = Limits(max_samples=3)
    x = np.zeros((4, 4), np.float32)
    buf = io.BytesIO()
    np.savez(buf, x=x, h=x)
    for body in (buf.getvalue(), {"inputs": {"x": x.tolist(), "h": x.tolist()}}):
        err = refused(body, CELL, limits)  # type: ignore[arg-type]
        assert err.status == 413 and "4 samples" in str(err)
    npy = io.BytesIO()
    np.save(npy, np.zeros((4, 1, 28, 28), np.float32))
    assert refused(npy.getvalue(), IMAGE, limits).status == 413
    # The batch axis need not be first: (seq, batch, features) counts axis 1.
    seq = [pl_codec.InputSpec("xs", ("seq", "batch", 4), "float32")]
    long_sequence = np.zeros((50, 3, 4)).tolist()
    assert pl_codec.decode_request({"inputs": long_sequence}, seq, False, limits).arrays
    assert refused({"inputs": np.zeros((2, 4, 4)).tolist()}, seq, limits).status == 413  # type: ignore[arg-type]
    # One sample without its batch axis counts as one.
    assert pl_codec.decode_request({"inputs": [0.0] * 4}, CELL[:1], False, Limits(max_samples=1))


def test_the_byte_limit_counts_every_input_before_reading() -> None:
    limits = Limits(max_bytes=2 * 8 * 4 * 4)  # two inputs of (8, 4) float32
    assert pl_codec.decode_request(zeros_npz({"x": (8, 4), "h": (8, 4)}), CELL, False, limits)
    err = refused(zeros_npz({"x": (9, 4), "h": (9, 4)}), CELL, limits)
    assert err.status == 413 and "288 bytes" in str(err)
    with pytest.raises(ValueError, match="max_samples"):
        Limits(max_samples=0)


def test_shared_axes_are_checked_before_the_sample_limit() -> None:
    """x of 5000 and h of 1 disagree: that is the answer, not 'too many samples'."""
    with pytest.raises(pl_codec.RequestError, match="share the axis 'batch'"):
        check_shapes({"x": (5000, 4), "h": (1, 4)}, CELL, Limits(max_samples=10))


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ((-1, 1, 28, 28), "must have shape"),
        ((0, 1, 28, 28), "must have shape"),
        ((10**30, 1, 28, 28), "the limit is"),
        ((-(10**30), -1, 28, 28), "the limit is"),
        ((2, 1, 28), "must have shape"),
    ],
)
def test_headers_declaring_impossible_shapes_are_refused(shape: tuple, fragment: str) -> None:
    body = npy_header(shape) + b"\x00" * 64
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w") as zf:
        zf.writestr("image.npy", body)
    for payload in (body, npz.getvalue()):
        err = refused(payload, IMAGE, DIGITS_LIMITS)
        assert 400 <= err.status < 500 and fragment in str(err), (shape, str(err))


def test_a_header_that_claims_more_data_than_it_carries_is_a_400() -> None:
    body = npy_header((2, 1, 28, 28)) + b"\x00" * 100
    err = refused(body, IMAGE, DIGITS_LIMITS)
    assert err.status == 400 and "not a readable .npy" in str(err)


def test_version_2_headers_are_read_and_unknown_versions_refused() -> None:
    data = np.ones((1, 4), np.float32)
    body = npy_header((1, 4), version=(2, 0)) + data.tobytes()
    np.testing.assert_array_equal(pl_codec.decode_request(body, CELL[:1], False).arrays["x"], data)
    v3 = bytearray(npy_header((1, 4))) + data.tobytes()
    v3[6:8] = b"\x03\x00"
    assert "version 3.0" in str(refused(bytes(v3), CELL[:1]))


def test_pickled_object_arrays_are_refused_without_being_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self) -> tuple:
            return (Path.touch, (marker,))

    payload = pickle.dumps(np.array([Exploit()], dtype=object))
    body = npy_header((1,), descr="|O") + payload
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w") as zf:
        zf.writestr("x.npy", body)
        zf.writestr("h.npy", npy_header((1, 4)) + b"\x00" * 16)
    for payload_body, specs in ((body, CELL[:1]), (npz.getvalue(), CELL)):
        err = refused(payload_body, specs)
        assert err.status == 400 and "pickle" in str(err)
    assert not marker.exists()


def test_a_member_longer_than_its_header_says_is_read_no_further() -> None:
    """The header bounds what is read: 50 MiB of zeros after the declared (1, 4) floats (about
    50 KB deflated) are never inflated."""
    head = npy_header((1, 4)) + b"\x00" * 16
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", head + b"\x00" * (50 * 2**20))
        zf.writestr("h.npy", head)
    assert len(buf.getvalue()) < 100_000
    tracemalloc.start()
    try:
        decoded = pl_codec.decode_request(buf.getvalue(), CELL, False, DIGITS_LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded.arrays["x"].shape == (1, 4)
    assert peak < 5 * 2**20


# --- fuzzing the header path --------------------------------------------------------------

DTYPES = ["<f4", ">f4", "<f8", "<i8", "|b1", "|O", "<U3", "<f2", [("a", "<f4")], ("<f4", (2,))]
dims = st.integers(-3, 6) | st.sampled_from([10**6, 2**31, 2**63, 10**30, -(10**30)])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.lists(dims, max_size=5).map(tuple),
    st.sampled_from(DTYPES),
    st.booleans(),
    st.sampled_from([(1, 0), (2, 0)]),
    st.integers(0, 600),
    st.sampled_from([IMAGE, CELL[:1], CELL]),
)
def test_any_declared_header_is_within_limits_or_a_4xx(
    shape: tuple, descr: Any, fortran: bool, version: tuple, data_len: int, specs: list
) -> None:
    limits = Limits(max_samples=4, max_bytes=4096)
    header = io.BytesIO()
    fields = {"descr": np.lib.format.dtype_to_descr(np.dtype(descr)), "fortran_order": fortran,
              "shape": shape}  # fmt: skip
    (np.lib.format.write_array_header_1_0 if version == (1, 0)
     else np.lib.format.write_array_header_2_0)(header, fields)  # fmt: skip
    npy = header.getvalue() + bytes(data_len)
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as zf:
        for spec in specs:
            zf.writestr(f"{spec.name}.npy", npy)
    for body in (npy, npz.getvalue()):
        try:
            decoded = pl_codec.decode_request(body, specs, False, limits)
        except pl_codec.RequestError as err:
            status = err.status
        else:
            status = 200
        if status != 200:
            assert 400 <= status < 500
            continue
        total = 0
        for spec in specs:
            array = decoded.arrays[spec.name]
            assert array.dtype == np.dtype(spec.dtype) and array.size > 0
            assert array.shape[spec.batch_axis or 0] <= 4
            total += array.nbytes
        assert total <= 4096


def test_a_wrong_shape_is_said_as_sent_and_an_empty_axis_is_named() -> None:
    """A fixed-shape input was said to have "named axes" that are "free"; an unbatched
    request's shape was reported with the batch axis added ("got [1, 1, 1, 2]" for
    [[[1, 2]]]); an empty sequence got the bare "must have shape" (users' trials)."""
    fixed = [pl_codec.InputSpec("images", (1, 3, 4, 4), "float32")]
    with pytest.raises(pl_codec.RequestError) as err:
        check_shapes({"images": (1, 1, 2)}, fixed)
    assert str(err.value) == "Input 'images' must have shape [1, 3, 4, 4], got [1, 1, 2]."
    with pytest.raises(pl_codec.RequestError) as err:
        check_shapes({"image": (1, 1, 2)}, IMAGE)
    assert str(err.value) == (
        "Input 'image' must have shape ['batch', 1, 28, 28] (batch: any size), got [1, 1, 2] "
        "(read as [1, 1, 1, 2], with a batch axis of 1)."
    )
    tokens = [pl_codec.InputSpec("ids", ("batch", "seq"), "int64")]
    with pytest.raises(pl_codec.RequestError, match=r"got \[1, 0\]; every axis needs at least"):
        check_shapes({"ids": (1, 0)}, tokens)
