"""Between `pipeline_runtime.oip`'s typed messages and kserve's own `InferRequest`/`InferResponse`.

The KServe runtime hands kserve its own types (kserve writes REST JSON, the
binary extension and gRPC answers from an `InferResponse`, and reads JSON and
gRPC requests into an `InferRequest`); `infer_response` builds one from an
`oip.Response`.

One exception: kserve 0.21's `InferRequest.from_bytes` reads each binary
tensor and then converts it into a Python list, one object per element
(`set_data_from_numpy(..., binary_data=False)`), which the model's
`as_numpy()` turns back into an array: 110 ms of a 145 ms request for one
224×224 image here, against 20 ms for the model itself. `from_bytes` below
reads the body with `oip.Request.from_rest` and builds the same
`InferRequest`, keeping each tensor's bytes, which `InferInput.as_numpy()`
reads with `np.frombuffer`. `install()` routes the REST data plane's binary
bodies through it; JSON bodies and gRPC (which keeps `raw_input_contents` as
bytes already) are untouched.

Import after kserve (the runtime hides sys.argv from kserve's import).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
from kserve.errors import InvalidInput
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.infer_type import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
)

from pipeline_runtime import oip


def from_bytes(body: bytes, json_length: int | None, model_name: str) -> InferRequest:
    """A binary-extension request (JSON header, then each tensor's bytes; `json_length`
    None: all JSON) → InferRequest, every malformed part an InvalidInput (400), never a 500."""
    try:
        request = oip.Request.from_rest(body, json_length)
    except oip.OipError as err:
        raise InvalidInput(str(err)) from None
    return infer_request(request, model_name)


def infer_request(request: oip.Request, model_name: str) -> InferRequest:
    """kserve's InferRequest of a typed request; binary tensors stay bytes (no lists)."""
    inputs = []
    for t in request.inputs:
        tensor = InferInput(
            name=t.name, shape=list(t.shape), datatype=t.datatype, parameters=dict(t.parameters)
        )
        if isinstance(t.data, list):
            tensor.data = t.data
        else:
            tensor._raw_data = t.raw()  # as_numpy reads it as it is
        inputs.append(tensor)
    requested = [
        RequestedOutput(name=o["name"], parameters=o.get("parameters")) for o in request.outputs
    ]
    return InferRequest(
        model_name=model_name,
        request_id=request.id,
        parameters=request.parameters or None,
        infer_inputs=inputs,
        request_outputs=requested or None,
    )


def infer_response(
    response: oip.Response, binary: bool, requested: list[RequestedOutput] | None
) -> InferResponse:
    """kserve's InferResponse of a typed answer (kserve writes it as REST JSON, binary or
    gRPC); `binary` and `requested` come from the request (`use_binary_outputs`, its outputs)."""
    outputs = []
    for t in response.outputs:
        out = InferOutput(name=t.name, shape=list(t.shape), datatype=t.datatype)
        out.set_data_from_numpy(np.ascontiguousarray(t.as_numpy()), binary_data=binary)
        outputs.append(out)
    return InferResponse(
        response_id=response.id,
        model_name=response.model_name,
        infer_outputs=outputs,
        use_binary_outputs=binary,
        requested_outputs=requested,
    )


def install() -> None:
    """Route the REST data plane's bodies that arrive as bytes through `from_bytes`."""
    original = DataPlane.decode_inference_request

    def decode_inference_request(
        self: DataPlane, body: Any, headers: Mapping[str, str], model_name: str
    ) -> InferRequest:
        if not isinstance(body, bytes):
            return original(self, body, headers, model_name)
        length = headers.get(INFERENCE_CONTENT_LENGTH_HEADER)
        json_length = None  # no header: JSON, whatever the Content-Type (the binary
        # extension's rule; FastAPI hands over a body without a Content-Type as bytes)
        if length is not None:
            try:
                json_length = int(length)
            except ValueError:
                raise InvalidInput(
                    f"{INFERENCE_CONTENT_LENGTH_HEADER} is not a number: {length!r:.40}."
                ) from None
        return from_bytes(body, json_length, model_name)

    DataPlane.decode_inference_request = decode_inference_request  # type: ignore[method-assign]
