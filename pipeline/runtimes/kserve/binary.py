"""From `pipeline_runtime.oip`'s typed answers to kserve's own `InferResponse`.

The KServe runtime answers gRPC requests (and any REST request `FastInfer` does
not take) through kserve, which writes REST JSON, the binary extension and gRPC
answers from an `InferResponse`; `infer_response` builds one from an
`oip.Response`. Requests need no such bridge: REST infer bodies for the served
models are read by `fastpath.FastInfer`, and gRPC keeps `raw_input_contents` as
bytes already.

Import after kserve (the runtime hides sys.argv from kserve's import).
"""

from __future__ import annotations

import numpy as np
from kserve.protocol.infer_type import InferOutput, InferResponse, RequestedOutput

from pipeline_runtime import oip


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
        model_version=response.model_version,
        infer_outputs=outputs,
        use_binary_outputs=binary,
        requested_outputs=requested,
    )
