"""Binary request bodies: NumPy `.npy`/`.npz` tensors and PNG/JPEG images, checked.

The fast path for big inputs: a 224×224 image is 150,000 floats, far
cheaper to send as 600 kB of float32 than as 2 MB of JSON text. Every
reader here is hardened against hostile files (pickles, zip bombs, image
bombs, corrupt archives): each failure is a `RequestError`, never a 500.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
from typing import IO

import numpy as np

from pipeline_runtime.request import (
    MAX_ELEMENTS,
    MAX_IMAGE_PIXELS,
    InputSpec,
    Limits,
    RequestError,
    check_shapes,
)


def decode_image(data: bytes) -> np.ndarray:
    """PNG/JPEG bytes → float32 (1, 1, H, W) grayscale in [0, 1]; the handler resizes it."""
    from PIL import Image

    # PIL warns at 89 Mpixel and raises only at twice that; a tiny PNG can
    # claim 30000×30000. Refuse anything bigger than a sane image up front.
    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise RequestError("The image is larger than 4096×4096 pixels.", status=413)
            gray = np.asarray(image.convert("L"), dtype=np.float32) / 255.0
    except RequestError:
        raise
    except Image.DecompressionBombError:
        raise RequestError("The image is larger than 4096×4096 pixels.", status=413) from None
    except Exception as err:  # noqa: BLE001 - PIL raises many types for broken files
        raise RequestError(f"The body looks like an image but cannot be decoded: {err}") from None
    return gray[None, None]  # resized by the handler with torch, exactly as in training


def _header(fp: IO[bytes], what: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a .npy declares, read from its header only (no data).

    numpy's own readers: the header is a Python literal, parsed with
    `ast.literal_eval` under a size limit, never unpickled.
    """
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
        else:  # 3.0 only adds UTF-8 field names, i.e. structured dtypes, refused anyway
            raise ValueError(f"format version {version[0]}.{version[1]} is not supported")
    except Exception as err:  # noqa: BLE001 - numpy raises many types for broken headers
        raise RequestError(f"{what} is not a readable .npy array: {err}") from None
    if dtype.hasobject:
        # Object arrays are pickles: loading one runs code. Never read past the header.
        raise RequestError(
            f"{what} is not a readable .npy array: it holds Python objects (a pickle), "
            "which are refused; send numbers."
        )
    return tuple(shape), dtype


def _check_dtype(spec: InputSpec, dtype: np.dtype) -> None:
    # Either byte order (a big-endian machine's or an explicit '>f4' .npy): _read makes it
    # this machine's; "must be float32, got >f4" refused the right numbers.
    if dtype.newbyteorder("=") != np.dtype(spec.dtype):
        raise RequestError(
            f"Input {spec.name!r} must be {spec.dtype}, got {dtype}.", expected=spec.describe()
        )


def _read(fp: IO[bytes], what: str) -> np.ndarray:
    """The array, once its header passed the checks (it allocates what the header declared)."""
    try:
        # allow_pickle=False: an object array would unpickle, i.e. run code.
        array = np.lib.format.read_array(fp, allow_pickle=False)
        return array.astype(array.dtype.newbyteorder("="), copy=False)
    except Exception as err:  # noqa: BLE001 - truncated data, a header that lies about its size
        raise RequestError(f"{what} is not a readable .npy array: {err}") from None


def numpy_arrays(
    data: bytes, kind: str, specs: Sequence[InputSpec], limits: Limits | None = None
) -> dict[str, np.ndarray]:
    """Binary tensors: one .npy for a one-input model, an .npz of named arrays otherwise.

    Every array's header is read and checked first (dtype, shape, `limits`,
    `MAX_ELEMENTS`); only then is any array allocated, so a small compressed
    .npz that declares a huge array costs nothing.
    """
    names = [s.name for s in specs]
    if kind == "npy":
        if len(specs) != 1:
            raise RequestError(
                f"This model takes inputs {names}: send an .npz holding one array per name.",
                expected=[s.describe() for s in specs],
            )
        shape, dtype = _header(io.BytesIO(data), "The body")
        _check_dtype(specs[0], dtype)
        check_shapes({names[0]: shape}, specs, limits)
        return {names[0]: _read(io.BytesIO(data), "The body")}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = {i.filename.removesuffix(".npy"): i for i in zf.infolist()}
            if sorted(members) != sorted(names):
                raise RequestError(
                    f"The .npz must hold arrays named {names}, got {sorted(members)}.",
                    expected=[s.describe() for s in specs],
                )
            # The zip's declared sizes first, then each array's header: nothing is
            # inflated beyond a header before the whole request is within limits.
            if any(i.file_size > MAX_ELEMENTS * 8 + 4096 for i in members.values()):
                raise RequestError("An array in the .npz is too large.", status=413)
            shapes = {}
            for spec in specs:
                with zf.open(members[spec.name]) as fp:
                    shapes[spec.name], dtype = _header(fp, f"Array {spec.name!r}")
                _check_dtype(spec, dtype)
            check_shapes(shapes, specs, limits)
            arrays = {}
            for n in names:
                with zf.open(members[n]) as fp:
                    arrays[n] = _read(fp, f"Array {n!r}")
    except RequestError:
        raise
    # Found by fuzzing: a bit-flipped or crafted archive also raises zlib.error
    # (corrupt deflate data), NotImplementedError (unknown compression method) and
    # RuntimeError (encrypted member), which escaped as a 500. Catch them all.
    except Exception as err:  # noqa: BLE001 - zipfile and its decompressors raise many types
        raise RequestError(f"The body is not a readable .npz archive: {err}") from None
    return arrays
