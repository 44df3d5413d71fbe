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

import numpy as np

from pipeline_runtime.request import MAX_ELEMENTS, MAX_IMAGE_PIXELS, InputSpec, RequestError


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


def _load_npy(data: bytes, what: str) -> np.ndarray:
    try:
        # allow_pickle=False: an object array would unpickle, i.e. run code.
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - numpy raises many types for broken files
        raise RequestError(f"{what} is not a readable .npy array: {err}") from None
    if not isinstance(array, np.ndarray):
        raise RequestError(f"{what} is not a .npy array.")
    return array


def numpy_arrays(data: bytes, kind: str, specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    """Binary tensors: one .npy for a one-input model, an .npz of named arrays otherwise."""
    names = [s.name for s in specs]
    if kind == "npy":
        if len(specs) != 1:
            raise RequestError(
                f"This model takes inputs {names}: send an .npz holding one array per name.",
                expected=[s.describe() for s in specs],
            )
        arrays = {specs[0].name: _load_npy(data, "The body")}
    else:
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                members = {i.filename.removesuffix(".npy"): i for i in zf.infolist()}
                if sorted(members) != sorted(names):
                    raise RequestError(
                        f"The .npz must hold arrays named {names}, got {sorted(members)}.",
                        expected=[s.describe() for s in specs],
                    )
                # The declared size is checked before anything is inflated (zip bombs).
                if any(i.file_size > MAX_ELEMENTS * 8 + 4096 for i in members.values()):
                    raise RequestError("An array in the .npz is too large.", status=413)
                arrays = {n: _load_npy(zf.read(members[n]), f"Array {n!r}") for n in names}
        except RequestError:
            raise
        # Found by fuzzing: a bit-flipped or crafted archive also raises zlib.error
        # (corrupt deflate data), NotImplementedError (unknown compression method) and
        # RuntimeError (encrypted member), which escaped as a 500. Catch them all.
        except Exception as err:  # noqa: BLE001 - zipfile and its decompressors raise many types
            raise RequestError(f"The body is not a readable .npz archive: {err}") from None
    for spec in specs:
        a = arrays[spec.name]
        if a.dtype != np.dtype(spec.dtype):
            raise RequestError(
                f"Input {spec.name!r} must be {spec.dtype}, got {a.dtype}.",
                expected=spec.describe(),
            )
    return arrays
