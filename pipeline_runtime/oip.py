"""The Open Inference Protocol (KServe v2): one datatype table and typed messages.

A `Tensor` (name, datatype, shape, data, parameters) holds its data as a
numpy array, as the raw little-endian bytes of the binary extension or of
gRPC's `raw_*_contents`, or as the flat list JSON carried; `as_numpy()`
reads any of them. A `Request` (inputs) and a `Response` (outputs) convert
themselves to and from each wire form:

* REST JSON: `to_json()` / `from_json()` (a dict), `to_rest()` / `from_rest()` (bytes);
* the binary extension: `to_rest(binary=True)` gives the JSON header followed
  by each tensor's bytes and the header's length, sent as `HEADER_LENGTH`;
  `from_rest(content, json_length)` reads it back;
* gRPC: `to_grpc()` / `from_grpc()` with kserve's generated `ModelInferRequest`
  and `ModelInferResponse` messages (imported only when called).

The protocol: https://github.com/kserve/open-inference-protocol (REST, gRPC) and
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md

In `pipeline_runtime` (TorchServe's workers, clients and the KServe runtime all
import it): numpy only, kserve lazily for gRPC. The KServe runtime answers with
kserve's own `InferResponse` (`pipeline.runtimes.kserve.binary` converts).
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"  # the binary extension's JSON length
PB2 = "kserve.protocol.grpc.grpc_predict_v2_pb2"  # kserve's generated gRPC messages


class OipError(ValueError):
    """A message that is not valid Open Inference Protocol."""


class DatatypeError(OipError):
    """A datatype (or numpy dtype) outside `TABLE`."""


@dataclass(frozen=True)
class Datatype:
    """A datatype's protocol name, numpy name and gRPC contents field (FP16: raw only)."""

    name: str
    numpy: str
    grpc_contents: str | None


# The fixed-size datatypes of the protocol; BYTES (length-prefixed strings) is not served.
TABLE = (
    Datatype("BOOL", "bool", "bool_contents"),
    Datatype("UINT8", "uint8", "uint_contents"),
    Datatype("UINT16", "uint16", "uint_contents"),
    Datatype("UINT32", "uint32", "uint_contents"),
    Datatype("UINT64", "uint64", "uint64_contents"),
    Datatype("INT8", "int8", "int_contents"),
    Datatype("INT16", "int16", "int_contents"),
    Datatype("INT32", "int32", "int_contents"),
    Datatype("INT64", "int64", "int64_contents"),
    Datatype("FP16", "float16", None),
    Datatype("FP32", "float32", "fp32_contents"),
    Datatype("FP64", "float64", "fp64_contents"),
)
BY_NAME = {d.name: d for d in TABLE}
DATATYPES = {d.name: d.numpy for d in TABLE}  # "FP32" → "float32"
NAMES = {d.numpy: d.name for d in TABLE}  # "float32" → "FP32"


def datatype_of(dtype: np.dtype | str) -> str:
    """The protocol's name for a numpy dtype: float32 → "FP32"."""
    try:
        return NAMES[np.dtype(dtype).name]
    except (KeyError, TypeError):
        raise DatatypeError(f"The protocol here carries {sorted(NAMES)}, not {dtype}.") from None


def dtype_of(datatype: str) -> np.dtype:
    """The numpy dtype of a protocol datatype: "FP32" → float32."""
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise DatatypeError(f"Datatype {datatype!r:.40} is not one of {sorted(DATATYPES)}.")
    return np.dtype(DATATYPES[datatype])


@dataclass(frozen=True, eq=False)
class Tensor:
    """One named tensor; `data` is a numpy array, raw little-endian bytes or JSON's list."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | bytes | list[Any]
    parameters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise OipError(f"A tensor's 'name' must be a string, got {self.name!r:.80}.")
        if not isinstance(self.shape, list | tuple) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in self.shape
        ):
            raise OipError(
                f"Tensor {self.name!r}: 'shape' must be a list of non-negative integers, "
                f"e.g. [1, 4]; got {self.shape!r:.80}."
            )
        object.__setattr__(self, "shape", tuple(self.shape))
        dtype = dtype_of(self.datatype)
        if not isinstance(self.parameters, dict):
            raise OipError(f"Tensor {self.name!r}: 'parameters' must be an object.")
        if isinstance(self.data, np.ndarray):
            if self.data.dtype != dtype or self.data.shape != self.shape:
                raise OipError(
                    f"Tensor {self.name!r}: an array of {self.data.dtype} {self.data.shape} "
                    f"is not {self.datatype} {list(self.shape)}."
                )
        elif isinstance(self.data, bytes | bytearray | memoryview):
            if len(self.data) != self.nbytes:
                raise OipError(
                    f"Tensor {self.name!r}: {len(self.data)} bytes do not hold "
                    f"{self.datatype} {list(self.shape)} ({dtype.itemsize} bytes per element)."
                )
        elif not isinstance(self.data, list):
            raise OipError(f"Tensor {self.name!r}: 'data' must be a list of numbers.")

    @classmethod
    def from_array(cls, name: str, array: Any, parameters: dict[str, Any] | None = None) -> Tensor:
        """A numpy array (or anything `np.asarray` takes) as a tensor of its own datatype."""
        a = np.asarray(array)
        return cls(name, datatype_of(a.dtype), a.shape, a, dict(parameters or {}))

    def as_numpy(self) -> np.ndarray:
        """The values in their shape and native byte order; from bytes, a read-only view."""
        dtype = dtype_of(self.datatype)
        if isinstance(self.data, np.ndarray):
            return self.data
        try:
            if isinstance(self.data, list):
                flat = np.asarray(self.data, dtype=dtype)
            else:
                flat = np.frombuffer(self.data, dtype=dtype.newbyteorder("<")).astype(
                    dtype, copy=False
                )
            return flat.reshape(self.shape)
        except (ValueError, TypeError, OverflowError) as err:
            raise OipError(
                f"Tensor {self.name!r}: 'data' is not {self.datatype} {list(self.shape)}: {err}"
            ) from None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_of(self.datatype).itemsize

    def raw(self) -> bytes:
        """The values as little-endian bytes (the binary extension's and gRPC's raw form)."""
        if isinstance(self.data, bytes | bytearray | memoryview):
            return bytes(self.data)
        a = np.ascontiguousarray(self.as_numpy())
        return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()

    def to_json(self, binary: bool = False) -> dict[str, Any]:
        """This tensor's JSON object; with `binary`, its bytes go after the header instead."""
        item = {"name": self.name, "shape": list(self.shape), "datatype": self.datatype}
        parameters = {k: v for k, v in self.parameters.items() if k != "binary_data_size"}
        if binary:
            parameters["binary_data_size"] = self.nbytes
        if parameters:
            item["parameters"] = parameters
        if not binary:
            flat = (
                self.data if isinstance(self.data, list) else self.as_numpy().reshape(-1).tolist()
            )
            item["data"] = flat
        return item

    @classmethod
    def from_json(cls, item: Any, tail: bytes, offset: int) -> tuple[Tensor, int]:
        """A tensor's JSON object → (tensor, offset after its bytes in `tail`)."""
        if not isinstance(item, dict):
            raise OipError(f"A tensor must be a JSON object, got {item!r:.80}.")
        missing = [k for k in ("name", "shape", "datatype") if k not in item]
        if missing:
            raise OipError(f"Tensor {item.get('name')!r}: needs {missing}.")
        parameters = item.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise OipError(f"Tensor {item['name']!r}: 'parameters' must be an object.")
        data = item.get("data")
        if data is None:
            size = parameters.get("binary_data_size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise OipError(
                    f"Tensor {item['name']!r}: no 'data' and no integer 'binary_data_size'."
                )
            if offset + size > len(tail):
                raise OipError(
                    f"Tensor {item['name']!r}: {size} bytes announced, {len(tail) - offset} left."
                )
            data, offset = tail[offset : offset + size], offset + size
        shape = item["shape"]
        shape = tuple(shape) if isinstance(shape, list) else shape
        return cls(item["name"], item["datatype"], shape, data, dict(parameters)), offset

    def to_grpc(self, message: Any) -> bytes:
        """Fill a gRPC `InferInputTensor`/`InferOutputTensor`; → its raw contents."""
        message.name, message.datatype = self.name, self.datatype
        message.shape.extend(self.shape)
        _fill_parameters(message, self.parameters)
        return self.raw()

    @classmethod
    def from_grpc(cls, message: Any, raw: bytes | None) -> Tensor:
        """A gRPC tensor with its raw contents, or with typed `contents` when `raw` is None."""
        data: bytes | list[Any] = raw if raw is not None else []
        if raw is None and getattr(BY_NAME.get(message.datatype), "grpc_contents", None):
            data = list(getattr(message.contents, BY_NAME[message.datatype].grpc_contents))
        parameters = _http_parameters(message.parameters)
        return cls(message.name, message.datatype, tuple(message.shape), data, parameters)


@dataclass(frozen=True, eq=False)
class _Message:
    """What a request and a response share: tensors, parameters, id and model fields."""

    tensors: ClassVar[str]  # "inputs" or "outputs": the JSON key of the tensors
    _grpc_message: ClassVar[str]  # the name of kserve's gRPC message

    parameters: dict[str, Any] = field(default_factory=dict, kw_only=True)
    id: str | None = field(default=None, kw_only=True)
    model_name: str | None = field(default=None, kw_only=True)
    model_version: str | None = field(default=None, kw_only=True)

    def _tensors(self) -> tuple[Tensor, ...]:
        return getattr(self, self.tensors)

    def arrays(self) -> dict[str, np.ndarray]:
        """The tensors by name, as numpy arrays in their shapes."""
        return {t.name: t.as_numpy() for t in self._tensors()}

    def _header(self) -> dict[str, Any]:
        fields = ("id", "model_name", "model_version")
        return {k: getattr(self, k) for k in fields if getattr(self, k) is not None}

    def to_json(self, binary: bool = False) -> dict[str, Any]:
        body = self._header()
        body[self.tensors] = [t.to_json(binary) for t in self._tensors()]
        body.update(self._extra_json())
        if self.parameters:
            body["parameters"] = dict(self.parameters)
        return body

    def _extra_json(self) -> dict[str, Any]:
        return {}

    def to_rest(self, binary: bool = False) -> tuple[bytes, int | None]:
        """JSON bytes and None, or the binary extension: header + tensor bytes, header length."""
        header = json.dumps(self.to_json(binary)).encode()
        if not binary:
            return header, None
        return header + b"".join(t.raw() for t in self._tensors()), len(header)

    @classmethod
    def from_json(cls, body: Any, tail: bytes = b"") -> Any:
        """A parsed JSON body; binary tensors are read in order from `tail`."""
        items = body.get(cls.tensors) if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise OipError(f"An Open Inference Protocol message needs '{cls.tensors}': a list.")
        tensors, offset = [], 0
        for item in items:
            tensor, offset = Tensor.from_json(item, tail, offset)
            tensors.append(tensor)
        if offset != len(tail):
            raise OipError(f"{len(tail) - offset} bytes after the last tensor.")
        fields = {k: body.get(k) for k in ("id", "model_name", "model_version")}
        if not all(v is None or isinstance(v, str) for v in fields.values()):
            raise OipError(f"'id', 'model_name' and 'model_version' must be strings: {fields}.")
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise OipError("'parameters' must be an object.")
        return cls(tuple(tensors), *cls._extra_from_json(body), parameters=parameters, **fields)

    @classmethod
    def _extra_from_json(cls, body: dict[str, Any]) -> tuple[Any, ...]:
        return ()

    def to_grpc(self) -> Any:
        """kserve's `ModelInferRequest`/`ModelInferResponse`, every tensor's bytes raw."""
        message = getattr(kserve_module(PB2), self._grpc_message)(**self._header())
        raw = getattr(message, f"raw_{self.tensors[:-1]}_contents")
        for tensor in self._tensors():
            raw.append(tensor.to_grpc(getattr(message, self.tensors).add()))
        _fill_parameters(message, self.parameters)
        return message

    @classmethod
    def from_grpc(cls, message: Any) -> Any:
        """A gRPC message; tensors from its raw contents, or else from their typed contents."""
        items = getattr(message, cls.tensors)
        raw = getattr(message, f"raw_{cls.tensors[:-1]}_contents")
        if raw and len(raw) != len(items):
            raise OipError(f"{len(raw)} raw contents for {len(items)} tensors.")
        tensors = tuple(Tensor.from_grpc(m, raw[i] if raw else None) for i, m in enumerate(items))
        fields = {k: getattr(message, k) or None for k in ("id", "model_name", "model_version")}
        parameters = _http_parameters(message.parameters)
        return cls(tensors, *cls._extra_from_grpc(message), parameters=parameters, **fields)

    @classmethod
    def _extra_from_grpc(cls, message: Any) -> tuple[Any, ...]:
        return ()

    @classmethod
    def from_rest(cls, content: bytes, json_length: int | None = None) -> Any:
        """REST bytes; `json_length` (the `HEADER_LENGTH` header) splits off binary tensors."""
        split = len(content) if json_length is None else json_length
        if not 0 < split <= len(content):
            raise OipError(f"{HEADER_LENGTH} is {json_length}; the body has {len(content)} bytes.")
        try:
            body = json.loads(content[:split])
        except (ValueError, RecursionError) as err:
            raise OipError(f"The JSON part is not JSON: {err}") from None
        return cls.from_json(body, content[split:])


@dataclass(frozen=True, eq=False)
class Request(_Message):
    """An inference request: input tensors, and the outputs asked for (name, parameters)."""

    tensors: ClassVar[str] = "inputs"
    _grpc_message: ClassVar[str] = "ModelInferRequest"
    inputs: tuple[Tensor, ...]
    outputs: tuple[dict[str, Any], ...] = ()

    def _extra_json(self) -> dict[str, Any]:
        return {"outputs": [dict(o) for o in self.outputs]} if self.outputs else {}

    @classmethod
    def _extra_from_json(cls, body: dict[str, Any]) -> tuple[Any, ...]:
        outputs = body.get("outputs") or []
        if not isinstance(outputs, list) or not all(
            isinstance(o, dict)
            and isinstance(o.get("name"), str)
            and isinstance(o.get("parameters") or {}, dict)  # a list here was a 500
            for o in outputs
        ):
            raise OipError("'outputs' must be a list of objects with a 'name' (and 'parameters').")
        return (tuple(outputs),)

    def to_grpc(self) -> Any:
        message = super().to_grpc()
        for out in self.outputs:  # a request's `outputs` are the outputs it asks for
            _fill_parameters(message.outputs.add(name=out["name"]), out.get("parameters") or {})
        return message

    @classmethod
    def _extra_from_grpc(cls, message: Any) -> tuple[Any, ...]:
        asked = [(o.name, _http_parameters(o.parameters)) for o in message.outputs]
        return (tuple({"name": n, **({"parameters": p} if p else {})} for n, p in asked),)


@dataclass(frozen=True, eq=False)
class Response(_Message):
    """An inference answer: output tensors."""

    tensors: ClassVar[str] = "outputs"
    _grpc_message: ClassVar[str] = "ModelInferResponse"
    outputs: tuple[Tensor, ...]


_PARAMETER_KINDS = {bool: "bool_param", int: "int64_param", str: "string_param"}


def _fill_parameters(message: Any, parameters: Mapping[str, Any]) -> None:
    """REST parameters into a gRPC message's `InferParameter`s (bool, int64 or string)."""
    for key, value in parameters.items():
        kind = _PARAMETER_KINDS.get(type(value))
        if kind is None:
            raise OipError(f"Parameter {key!r}: gRPC carries bool, int or str, not {value!r:.40}.")
        setattr(message.parameters[key], kind, value)


def _http_parameters(parameters: Any) -> dict[str, Any]:
    kinds = {key: value.WhichOneof("parameter_choice") for key, value in parameters.items()}
    return {key: getattr(parameters[key], kind) for key, kind in kinds.items() if kind}


def kserve_module(name: str) -> ModuleType:
    """Import a kserve module: kserve 0.21 parses sys.argv when imported (prefix-matching
    its options against the caller's), so it sees an empty command line."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        return importlib.import_module(name)
    finally:
        sys.argv = saved
