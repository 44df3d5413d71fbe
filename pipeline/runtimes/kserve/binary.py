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

from pipeline.runtimes.kserve.fastpath import ClientError
from pipeline_runtime import oip
from pipeline_runtime.asked import AskedError, chosen


def requested(asked: list[RequestedOutput] | None, names: list[str]) -> list[str]:
    """The outputs a request asks for (`request_outputs`), in its order; all of `names` when
    it names none. fastpath.ClientError as the REST route refuses them: an output the model
    lacks, the classification extension, a binary_data that is not a boolean."""
    try:
        return [name for name, _ in chosen([(o.name, o.parameters) for o in asked or ()], names)]
    except AskedError as err:
        raise ClientError(str(err)) from None


def infer_response(
    response: oip.Response, binary: bool, asked: list[RequestedOutput] | None
) -> InferResponse:
    """kserve's InferResponse of a typed answer (kserve writes it as REST JSON, binary or
    gRPC): the outputs `asked` only (kserve's gRPC writer answers every output it is given);
    `binary` and `asked` come from the request (`use_binary_outputs`, `request_outputs`)."""
    tensors = {t.name: t for t in response.outputs}
    outputs = []
    for t in (tensors[name] for name in requested(asked, list(tensors))):
        out = InferOutput(name=t.name, shape=list(t.shape), datatype=t.datatype)
        # np.require keeps a 0-d output 0-d (ascontiguousarray makes it 1-d).
        out.set_data_from_numpy(np.require(t.as_numpy(), requirements="C"), binary_data=binary)
        outputs.append(out)
    return InferResponse(
        response_id=response.id,
        model_name=response.model_name,
        model_version=response.model_version,
        infer_outputs=outputs,
        use_binary_outputs=binary,
        requested_outputs=asked,
    )
