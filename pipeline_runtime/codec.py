"""Request decoding and response encoding for the pipeline's TorchServe handler.

Pure functions over bytes, dicts and numpy arrays (no torch, no TorchServe),
so they can be tested and fuzzed on their own. Shipped inside every `.mar`
with the rest of `pipeline_runtime` (`pipeline_runtime.handler` calls it).

Accepted request bodies (the batch axis may be left out for one sample):

* JSON tensors: ``{"inputs": [[...]]}`` for a one-input model, or
  ``{"inputs": {"x": [...], "h": [...]}}`` with names.
* Open Inference Protocol (KServe v2): ``{"inputs": [{"name": "x",
  "shape": [1, 4], "datatype": "FP32", "data": [...]}]}``.
* Binary tensors: one NumPy `.npy`, or an `.npz` of named arrays
  (`pipeline_runtime.binary`).
* An image (PNG or JPEG bytes) for models whose manifest declares image
  preprocessing (the digits CNN).

The limits and `RequestError` live in `pipeline_runtime.request`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline_runtime import oip
from pipeline_runtime.asked import AskedError, chosen, unbatch
from pipeline_runtime.binary import decode_image, numpy_arrays
from pipeline_runtime.jsonarray import JSON_DTYPES, to_array
from pipeline_runtime.request import (
    MAX_ELEMENTS,
    MAX_IMAGE_PIXELS,
    MAX_JSON_DEPTH,
    InputSpec,
    Limits,
    RequestError,
    check_range,
    check_shapes,
    sniff,
)

__all__ = [
    "MAX_ELEMENTS",
    "MAX_IMAGE_PIXELS",
    "MAX_JSON_DEPTH",
    "Decoded",
    "InputSpec",
    "Limits",
    "RequestError",
    "check_arrays",
    "decode_image",
    "decode_request",
    "encode_outputs",
    "oip_arrays",
    "parse_body",
]

V2_DATATYPES, V2_NAMES = oip.DATATYPES, oip.NAMES  # for callers that read them from here


@dataclass(frozen=True)
class Decoded:
    """Named input arrays, each with the batch axis, and the request's protocol."""

    arrays: dict[str, np.ndarray]
    protocol: str  # "json", "v2" or "image"
    unbatched: bool  # the client left out the batch axis; answer without it
    # The outputs an OIP request asked for, in its order (None: every output).
    asked: tuple[str, ...] | None = None


def parse_body(body: Any) -> tuple[Any, str]:
    """TorchServe hands over JSON already parsed, or raw bytes/str. → (value, kind)."""
    if isinstance(body, dict | list):
        return body, "json"
    if isinstance(body, bytearray | memoryview):
        body = bytes(body)
    if body is None or (isinstance(body, bytes | str) and len(body) == 0):
        raise RequestError('Empty request body. Send JSON like {"inputs": [...]} or an image.')
    if isinstance(body, bytes):
        kind = sniff(body[:8])
        if kind in ("png", "jpeg"):
            return body, "image"
        if kind in ("npy", "npz"):
            return body, kind
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(
                "The body is neither UTF-8 JSON, a NumPy .npy/.npz nor a PNG/JPEG image.",
                status=415,
            ) from None
    if isinstance(body, str):
        text = body.strip()
        if not text.startswith(("{", "[")) and not _json_scalar(text):
            raise RequestError(
                'The body is not JSON (it does not start with "{" or "["), nor a NumPy .npy/.npz '
                'or a PNG/JPEG image. Send JSON like {"inputs": [...]}; its Content-Type does '
                "not matter.",
                status=415,
            )
        try:
            return json.loads(text, parse_constant=_reject_constant), "json"
        except RecursionError:
            raise RequestError("The JSON body is nested too deeply.") from None
        except ValueError as err:
            raise RequestError(f"Malformed JSON: {err}") from None
    raise RequestError(f"Unsupported body type {type(body).__name__}.", status=415)


def _json_scalar(text: str) -> bool:
    """`null`, `3`, `"x"`: JSON, but no request (a 400 saying what is wanted, not "not
    JSON"). Short texts only: a scalar body is a few characters."""
    try:
        return len(text) <= 64 and not isinstance(json.loads(text), dict | list)
    except ValueError:
        return False


def _reject_constant(name: str) -> float:
    # json.loads accepts NaN/Infinity literals by default; a tensor body must not.
    raise ValueError(f"{name} is not allowed in input tensors")


@dataclass(frozen=True)
class _JsonTensor:
    """An OIP JSON tensor as sent, unchecked (oip_arrays checks each field)."""

    name: Any
    datatype: Any
    shape: Any
    data: Any


def oip_arrays(
    tensors: Sequence[Any], specs: Sequence[InputSpec], limits: Limits | None = None
) -> tuple[dict[str, np.ndarray], bool]:
    """Open Inference Protocol input tensors → checked arrays with their batch axis, and
    whether they had none (`check_arrays`). RequestError (400, or 413 past `limits`).

    The one server-side reader of OIP inputs: the KServe runtime's (REST and gRPC, as
    `oip.Tensor` or kserve's `InferInput`: name, datatype, shape, data or as_numpy) and
    the TorchServe handler's OIP JSON. JSON values go through the same range checks as
    the handlers' JSON (`jsonarray.to_array`): 1.5 or 1e300 for an INT64 input is refused, not
    truncated or wrapped as numpy's cast would."""
    names = [s.name for s in specs]
    got = [getattr(t, "name", None) for t in tensors]
    if sorted(map(str, got)) != sorted(names):
        raise RequestError(
            f"Inputs must be named {names}, got {got}.", expected=[s.describe() for s in specs]
        )
    by_name = {s.name: s for s in specs}
    arrays = {}
    for item in tensors:
        spec = by_name[str(item.name)]
        wanted = oip.NAMES.get(spec.dtype)
        if item.datatype != wanted:
            raise RequestError(
                f"Input {spec.name!r}: datatype must be {wanted}, got {item.datatype!r}.",
                expected=spec.describe(),
            )
        shape = item.shape
        # Found by fuzzing: with a zero dimension math.prod no longer bounds the others,
        # and numpy's reshape raised ValueError (a 500) for [0, 10**30] or for more than
        # 64 dimensions: refuse them before reshaping.
        if (
            not isinstance(shape, list | tuple)
            or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
            or any(d < 1 for d in shape)
            or len(shape) > len(spec.shape)
            or math.prod(shape) > MAX_ELEMENTS
        ):
            raise RequestError(
                f"Input {spec.name!r}: shape {shape} has too many dimensions or is empty, "
                f"negative or too large; expected {list(spec.shape)}.",
                expected=spec.describe(),
            )
        data = getattr(item, "data", None)
        size = math.prod(shape)
        # JSON values (a list; or, for a JSON tensor, whatever 'data' holds) are range-checked
        # as the handlers' JSON are; raw bytes (binary extension, gRPC) are read by as_numpy
        # (kserve's gRPC InferInput holds them beside an empty `data` list).
        values = isinstance(data, list) and bool(data) and spec.dtype in JSON_DTYPES
        if not hasattr(item, "as_numpy") or values:
            flat = to_array(data, spec).reshape(-1) if isinstance(data, list) else None
            if flat is None or flat.size != size:
                raise RequestError(
                    f"Input {spec.name!r}: 'data' must hold {size} values for shape {shape}.",
                    expected=spec.describe(),
                )
            arrays[spec.name] = flat.reshape(shape)
            continue
        try:  # raw bytes: a copy, as binary tensors are read-only views of the body
            arrays[spec.name] = np.array(item.as_numpy()).reshape(shape)
        except Exception as err:  # noqa: BLE001 - a bad tensor is this request's 400
            raise RequestError(
                f"Input {spec.name!r}: data does not match shape {list(shape)} and datatype "
                f"{item.datatype} ({type(err).__name__}: {err}).",
                expected=spec.describe(),
            ) from None
    return check_arrays(arrays, specs, limits)


def _collect(body: Any, specs: Sequence[InputSpec]) -> tuple[dict[str, np.ndarray], str]:
    if not isinstance(body, dict) or "inputs" not in body:
        raise RequestError(
            "The JSON body must be an object with an 'inputs' field.",
            expected={"inputs": [s.describe() for s in specs]},
        )
    inputs = body["inputs"]
    names = [s.name for s in specs]
    by_name = {s.name: s for s in specs}
    is_v2 = (
        isinstance(inputs, list)
        and bool(inputs)
        and all(isinstance(i, dict) for i in inputs)
        and any("datatype" in i for i in inputs)
    )
    if is_v2:  # Open Inference Protocol: its one reader, oip_arrays (decode_request)
        return {}, "v2"
    if isinstance(inputs, dict):
        if sorted(inputs) != sorted(names):
            raise RequestError(
                f"Inputs must be named {names}, got {sorted(map(str, inputs))}.",
                expected=[s.describe() for s in specs],
            )
        return {n: to_array(inputs[n], by_name[n]) for n in names}, "json"
    if len(specs) != 1:
        raise RequestError(
            f"This model takes {len(specs)} inputs; send them by name: "
            + json.dumps({"inputs": {n: "[...]" for n in names}}).replace('"[...]"', "[...]")
            + ".",
            expected=[s.describe() for s in specs],
        )
    return {specs[0].name: to_array(inputs, specs[0])}, "json"


def check_arrays(
    arrays: dict[str, np.ndarray], specs: Sequence[InputSpec], limits: Limits | None = None
) -> tuple[dict[str, np.ndarray], bool]:
    """Check shapes and limits (`check_shapes`), add a missing batch axis, refuse NaN/Inf.

    → (arrays, unbatched).
    """
    shapes, unbatched = check_shapes({s.name: arrays[s.name].shape for s in specs}, specs, limits)
    out = {}
    for spec in specs:
        a = arrays[spec.name].reshape(shapes[spec.name])  # a view: only a batch axis is added
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise RequestError(
                f"Input {spec.name!r} contains NaN or Inf; the model needs finite values.",
                expected=spec.describe(),
            )
        if spec.bounded and a.dtype.kind in "iu" and a.size:
            check_range(a, spec)
        out[spec.name] = np.ascontiguousarray(a)
    return out, unbatched


def warm_up_inputs(
    arrays: Mapping[str, np.ndarray], specs: Sequence[InputSpec]
) -> dict[str, np.ndarray]:
    """The export's golden inputs made to fit `specs`: an axis the artifact was compiled
    at one size for (--fix-axis) is cut or repeated to that size (values do not matter
    for a warm-up; the shape does)."""
    out = dict(arrays)
    for spec in specs:
        a = out.get(spec.name)
        if a is None or a.ndim != len(spec.shape):
            continue
        for axis, want in enumerate(spec.shape):
            if isinstance(want, int) and a.shape[axis] != want and a.shape[axis] > 0:
                a = np.take(a, np.arange(want) % a.shape[axis], axis=axis)
        out[spec.name] = a
    return out


def decode_request(
    body: Any,
    specs: Sequence[InputSpec],
    accepts_images: bool,
    limits: Limits | None = None,
    outputs: Sequence[str] = (),
) -> Decoded:
    """One request body → checked arrays. Raises RequestError with a 4xx status.

    `limits` bound the samples and decoded bytes of one request; .npy/.npz
    bodies are checked against them from their headers, before any array is read.
    `outputs`: the model's output names, against which an OIP request's `outputs` are
    checked (pipeline_runtime.asked; its answer then holds those alone).
    """
    value, kind = parse_body(body)
    if kind in ("npy", "npz"):
        arrays, unbatched = check_arrays(numpy_arrays(value, kind, specs, limits), specs, limits)
        return Decoded(arrays, kind, unbatched)
    if kind == "image":
        if not accepts_images:
            raise RequestError(
                "This model does not take images; send its input tensors as JSON, or as a NumPy "
                ".npy/.npz body (binary: a fraction of JSON's size, for large inputs).",
                status=415,
                expected={"inputs": [s.describe() for s in specs]},
            )
        return Decoded({specs[0].name: decode_image(value)}, "image", unbatched=False)
    arrays, protocol = _collect(value, specs)
    if protocol == "v2":  # OIP JSON, data inline: each tensor as its JSON object says
        tensors = [
            _JsonTensor(i.get("name"), i.get("datatype"), i.get("shape"), i.get("data"))
            for i in value["inputs"]
        ]
        arrays, unbatched = oip_arrays(tensors, specs, limits)
        return Decoded(arrays, protocol, unbatched, _asked(value, outputs))
    arrays, unbatched = check_arrays(arrays, specs, limits)
    return Decoded(arrays, protocol, unbatched)


def _asked(body: dict[str, Any], names: Sequence[str]) -> tuple[str, ...] | None:
    """The outputs an OIP JSON request asks for (None: all), checked as every runtime
    checks them (asked.chosen). Answered in JSON: this server has no binary extension."""
    wanted = body.get("outputs")
    parameters = body.get("parameters")
    if not names or (wanted is None and parameters is None):
        return None
    if wanted is not None and not (
        isinstance(wanted, list)
        and all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted)
        and all(isinstance(o.get("parameters"), dict | None) for o in wanted)
    ):
        raise RequestError(
            "'outputs' must be a list of objects, each with a string 'name' (and an object of "
            'parameters), e.g. [{"name": "logits"}].'
        )
    if not isinstance(parameters, dict | None):
        raise RequestError("'parameters' must be an object.")
    try:
        plan = chosen(
            ((o["name"], o.get("parameters")) for o in wanted or ()),
            names,
            (parameters or {}).get("binary_data_output", False),
        )
    except AskedError as err:
        raise RequestError(str(err)) from None
    if any(binary for _, binary in plan):
        raise RequestError(
            "This server answers JSON only (it has no binary tensor extension): ask for the "
            "outputs without binary_data or binary_data_output."
        )
    return tuple(name for name, _ in plan) if wanted else None


def encode_outputs(
    names: Sequence[str],
    outputs: Sequence[np.ndarray],
    protocol: str,
    model_name: str,
    unbatched: bool,
    topk: int = 0,
    per_sample: Sequence[str] = (),
    asked: Sequence[str] | None = None,
    model_version: str | None = None,
) -> dict[str, Any]:
    """Raw outputs (and top-k classes for classifiers) as a JSON-able dict; `asked`: the
    outputs an OIP request named, in its order (Decoded.asked; None: every one)."""
    if unbatched:
        outputs = unbatch(outputs, names, per_sample)
    scores = outputs[0]  # top-k is of the model's first output, whichever were asked for
    if asked is not None:
        by_name = dict(zip(names, outputs, strict=True))
        names, outputs = list(asked), [by_name[n] for n in asked]
    if protocol == "v2":
        tensors = tuple(oip.Tensor.from_array(n, o) for n, o in zip(names, outputs, strict=True))
        answer = oip.Response(tensors, model_name=model_name, model_version=model_version)
        body: dict[str, Any] = answer.to_json()
    else:
        body = {"outputs": {n: o.tolist() for n, o in zip(names, outputs, strict=True)}}
    if topk:
        logits = np.asarray(scores, dtype=np.float64)
        rows = logits[None] if logits.ndim == 1 else logits
        shifted = np.exp(rows - rows.max(axis=-1, keepdims=True))
        probs = shifted / shifted.sum(axis=-1, keepdims=True)
        top = [
            [{"class": int(c), "probability": float(p[c])} for c in np.argsort(-p)[:topk]]
            for p in probs
        ]
        body["topk"] = top[0] if logits.ndim == 1 else top
    return body
