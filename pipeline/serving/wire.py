"""What a request and its answer look like on each runtime `pipeline serve` starts.

TorchServe (behind the gateway) runs the pipeline's handler: `POST
/predictions/<archive>` with the handlers' JSON (`{"inputs": {...}}`), an
`.npy`/`.npz` body or an image; it answers `{"outputs": {name: nested list}}`
(or Open Inference Protocol JSON when asked in it). The KServe runtime speaks
the Open Inference Protocol only: `POST /v2/models/<name>/infer` with OIP
JSON, or its binary extension — a JSON header giving each tensor's
`binary_data_size`, then the raw little-endian bytes, the header's length in
`Inference-Header-Content-Length` — and answers OIP JSON.

Each runtime's protocol (`Runtime.protocol`, pipeline.serving.protocol) builds its
request bodies from these and reads its own answers (`Protocol.decode`: OIP's with
`decode_oip`, TorchServe's in its package), so `pipeline infer`, loadtest, bench and
verify share one definition of each protocol and no reader guesses which one a body
speaks. The Open Inference Protocol itself (JSON, binary extension, datatypes) is
written once, in `pipeline_runtime.oip`; the functions here are thin wrappers over it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.serving.live import VERSION_HEADER
from pipeline_runtime import oip

HEADER_LENGTH = oip.HEADER_LENGTH  # the OIP binary extension's header


class WireError(ValueError):
    """An answer that is neither runtime's shape, or inputs a protocol cannot carry."""


@dataclass(frozen=True)
class Body:
    """One request body and the headers that say how to read it."""

    content: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")


def tensors_body(inputs: Mapping[str, torch.Tensor]) -> bytes:
    """Named tensors as the handlers' JSON format (exact for float32: repr round-trips)."""
    return json.dumps(
        {"inputs": {k: v.detach().cpu().tolist() for k, v in inputs.items()}}
    ).encode()


def numpy_body(inputs: Mapping[str, torch.Tensor]) -> bytes:
    """Named tensors as binary NumPy: one .npy for one input, an .npz otherwise.

    Much cheaper than JSON for big inputs (a 224×224 image: 600 kB instead of 2 MB of text,
    and no number parsing on either side).
    """
    buf = io.BytesIO()
    arrays = {k: _array(v) for k, v in inputs.items()}
    if len(arrays) == 1:
        np.save(buf, next(iter(arrays.values())), allow_pickle=False)
    else:
        np.savez(buf, **arrays)
    return buf.getvalue()


def _array(t: torch.Tensor | np.ndarray) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _request(inputs: Mapping[str, torch.Tensor | np.ndarray]) -> oip.Request:
    try:
        return oip.Request(tuple(oip.Tensor.from_array(k, _array(v)) for k, v in inputs.items()))
    except oip.DatatypeError as err:
        raise WireError(str(err)) from None


def oip_json(inputs: Mapping[str, torch.Tensor | np.ndarray]) -> bytes:
    """An Open Inference Protocol JSON request (data as flat lists)."""
    return _request(inputs).to_rest()[0]


def oip_binary(inputs: Mapping[str, torch.Tensor | np.ndarray]) -> Body:
    """An Open Inference Protocol request in its binary extension: no number parsing."""
    content, length = _request(inputs).to_rest(binary=True)
    return Body(content, {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(length)})


def decode_oip(content: bytes, headers: Mapping[str, str] | None = None) -> dict[str, torch.Tensor]:
    """An Open Inference Protocol answer (JSON, or its binary extension: the JSON header's
    length in `headers`) → named output tensors with the answer's datatypes. WireError for
    any other body (TorchServe's handler answer, `{"outputs": {...}}`, included)."""
    length = next(
        (v for k, v in (headers or {}).items() if k.lower() == HEADER_LENGTH.lower()), None
    )
    try:
        split = int(length) if length is not None else len(content)
        body = json.loads(content[:split])
        response = oip.Response.from_json(body, content[split:])
        return {t.name: torch.from_numpy(t.as_numpy().copy()) for t in response.outputs}
    except (ValueError, TypeError) as err:  # oip.OipError is a ValueError
        raise WireError(f"Not an Open Inference Protocol answer: {err}") from None


def oip_from_file(content: bytes, kind: str, inputs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """A request file's tensors for an Open Inference Protocol model whose metadata lists
    `inputs` (`GET /v2/models/<name>`: name, datatype, shape of each).

    `kind` is "json" (the handlers' `{"inputs": ...}`: a list for the first
    input, or a dict by name), "npy"/"npz", or "tensors" (`content` already
    an `.npz` of the named tensors). Values take the model's datatypes, as
    the handler would cast them.
    """
    names = [str(i["name"]) for i in inputs]
    dtypes = {
        str(i["name"]): np.dtype(oip.DATATYPES.get(i.get("datatype"), "float32")) for i in inputs
    }
    if kind == "json":
        body = json.loads(content)
        if not isinstance(body, dict) or "inputs" not in body:
            first = f'{{"inputs": {{"{names[0]}": [...]}}}}'
            raise WireError(
                'A JSON request file holds one object with the key "inputs": {"inputs": '
                f"[...]}} (the first input's values) or {first} (values by input name, of "
                f"{names}), as the handlers take it"
                + (
                    f'; this file\'s keys are {sorted(body)[:5]}: put them under "inputs".'
                    if isinstance(body, dict) and set(body) <= set(names) and body
                    else "."
                )
            )
        value = body["inputs"]
        named = value if isinstance(value, dict) else {names[0]: value}
    else:
        # np.load takes anything else for a pickle and advises allow_pickle=, which would
        # run code from the file: a file that is neither is refused as such.
        if not content.startswith((b"\x93NUMPY", b"PK\x03\x04")):
            raise WireError("The file is neither an .npy nor an .npz (no NumPy or zip header).")
        loaded = np.load(io.BytesIO(content), allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            named = {names[0]: loaded}
        else:  # an .npz
            with loaded:
                named = {k: loaded[k] for k in loaded.files}
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise WireError(f"The model has no input(s) {unknown}; its inputs are {names}.")
    out = {}
    for k, v in named.items():
        array = np.asarray(v)
        if (
            dtypes[k].kind in "iub"
            and array.dtype.kind == "f"
            and not np.all(array == np.trunc(array))
        ):
            # Cast, 1.5 became 1: the server refuses a fraction for an integer input.
            raise WireError(f"Input {k!r} is {dtypes[k]}, but the file holds fractions (e.g. 1.5).")
        out[k] = array.astype(dtypes[k])
    return out


def answer_version(response: Any) -> str | None:
    """The version that gave an answer: the header, else the OIP JSON's `model_version`."""
    named = response.headers.get(VERSION_HEADER)
    if named:
        return str(named)
    length = response.headers.get(HEADER_LENGTH)
    try:
        body = json.loads(response.content[: int(length)] if length else response.content)
    except (ValueError, TypeError):
        return None
    version = body.get("model_version") if isinstance(body, dict) else None
    return str(version) if version is not None else None


__all__ = [
    "HEADER_LENGTH",
    "VERSION_HEADER",
    "Body",
    "WireError",
    "answer_version",
    "decode_oip",
    "numpy_body",
    "oip_binary",
    "oip_from_file",
    "oip_json",
    "tensors_body",
]
