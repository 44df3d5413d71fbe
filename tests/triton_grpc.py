"""Triton's gRPC client (`tritonclient.grpc`), run in a process of its own.

tritonclient.grpc and kserve both register the `inference` protobuf package in
protobuf's default descriptor pool, so one process cannot import both (the
second import fails: duplicate symbol 'inference.ServerLiveRequest'). The
tests import kserve, so they drive Triton's gRPC client through this module:

    python -m tests.triton_grpc infer HOST:PORT TOKEN MODEL INPUT IN.npy OUTPUT OUT.npy [VERSION]
                                     # prints {"model_version": ...} of the answer,
                                     # or {"error": "StatusCode...", "message": ...}
    python -m tests.triton_grpc describe HOST:PORT TOKEN MODEL[@VERSION]...   # JSON on stdout

With TRACEPARENT in the environment, every call sends it as `traceparent` metadata.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException


def main(argv: list[str]) -> int:
    command, url, token, *rest = argv
    headers = {"authorization": f"Bearer {token}"}  # gRPC metadata keys are lowercase
    if os.environ.get("TRACEPARENT"):
        headers["traceparent"] = os.environ["TRACEPARENT"]
    client = tgrpc.InferenceServerClient(url)
    try:
        if command == "infer":
            model, name, source, output, target, *version = rest
            x = np.load(source)
            tensor = tgrpc.InferInput(name, list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            try:
                result = client.infer(
                    model, [tensor], model_version=version[0] if version else "", headers=headers
                )
            except InferenceServerException as err:  # its status code, for the test to read
                print(json.dumps({"error": err.status(), "message": err.message()}))
                return 0
            np.save(target, result.as_numpy(output))
            print(json.dumps({"model_version": result.get_response().model_version}))
            return 0
        described = {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "models": {model: _model(client, model, headers) for model in rest},
        }
        print(json.dumps(described))
        return 0
    finally:
        client.close()


def _model(client: tgrpc.InferenceServerClient, model: str, headers: dict) -> dict:
    model, _, version = model.partition("@")  # MODEL@VERSION: that version's
    try:
        ready = client.is_model_ready(model, version, headers=headers)
        meta = client.get_model_metadata(model, version, headers=headers, as_json=True)
    except InferenceServerException as err:  # an unknown model is NOT_FOUND, not "not ready"
        return {"error": err.status()}
    return {"ready": ready, "metadata": meta}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
