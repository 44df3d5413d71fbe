"""TorchServe's config.properties, its one writer: the local server's (launch.py) and
the one KServe's TorchServe ServingRuntime (kserve-torchserve) reads beside the archive
in the layout `pipeline deploy kserve` writes (the Packaging capability's
`layout_files`)."""

from __future__ import annotations

import json
from typing import Any

from pipeline_runtime.responses import DEFAULT_MAX_RESPONSE

# The ports TorchServe listens on inside KServe's torchserve-kfs image.
TS_INFERENCE_PORT = 8085
TS_METRICS_PORT = 8082
TS_GRPC_INFERENCE_PORT = 7070
TS_GRPC_MANAGEMENT_PORT = 7071
POD_HOST = "0.0.0.0"  # inside a pod: loopback would be unreachable from the kubelet


def model_snapshot(mar_name: str) -> dict[str, Any]:
    """TorchServe's startup snapshot: one model, batch size 1.

    Batch size 1 because TorchServe 0.12's kservev2 envelope answers only the first
    request of a batch (pytorch/serve#2158), should a user turn the envelope on."""
    return {
        "name": "startup.cfg",
        "modelCount": 1,
        "models": {
            mar_name: {
                "1.0": {
                    "defaultVersion": True,
                    "marName": f"{mar_name}.mar",
                    "minWorkers": 1,
                    "maxWorkers": 1,
                    "batchSize": 1,
                    "maxBatchDelay": 1,
                    "responseTimeout": 60,
                }
            }
        },
    }


def on_kserve(mar_name: str, *, host: str = POD_HOST, envelope: bool = False) -> dict[str, str]:
    """config.properties for KServe's TorchServe runtime (its keys, its ports).

    The KServe wrapper in the torchserve-kfs image reads inference_address,
    management_address, model_store and model_snapshot (one line of JSON).

    No kservev2 envelope by default (`envelope=False`), and env config off so the
    runtime's TS_SERVICE_ENVELOPE=kservev2 cannot switch it on: the envelope hands a
    handler the bare list of input tensors instead of the request body, which the
    project's handler refuses (400 "The JSON body must be an object with an
    'inputs' field", checked with TorchServe 0.12.0). Without it TorchServe's own
    /v2/models/<name>/infer route passes the Open Inference Protocol body through,
    and the handler decodes and answers it in OIP v2 itself."""
    return {
        "inference_address": f"http://{host}:{TS_INFERENCE_PORT}",
        "management_address": f"http://{host}:{TS_INFERENCE_PORT}",
        "metrics_address": f"http://{host}:{TS_METRICS_PORT}",
        "grpc_inference_port": str(TS_GRPC_INFERENCE_PORT),
        "grpc_management_port": str(TS_GRPC_MANAGEMENT_PORT),
        "enable_metrics_api": "true",
        "metrics_mode": "prometheus",
        "number_of_netty_threads": "4",
        "job_queue_size": "10",
        **(
            {"service_envelope": "kservev2", "enable_envvars_config": "true"}
            if envelope
            else {"enable_envvars_config": "false"}
        ),
        "install_py_dep_per_model": "false",
        # The handler's own limit (pipeline_runtime.responses): past it, its request's 500.
        "max_response_size": str(DEFAULT_MAX_RESPONSE),
        "model_store": "/mnt/models/model-store",
        # The management API listens beside inference on the pod's address (the wrapper's
        # layout) with no token: TorchServe's default allowed_urls took any http(s) URL, so
        # whoever reached the pod could register a remote archive and run its code.
        "allowed_urls": "file:///mnt/models/model-store/[^/]+[.]mar",  # no "../" way out
        "model_snapshot": json.dumps(model_snapshot(mar_name), separators=(",", ":")),
    }


def text(props: dict[str, str]) -> str:
    """`props` as config.properties lines."""
    return "".join(f"{k}={v}\n" for k, v in props.items())


def parse(content: str) -> dict[str, str]:
    """config.properties text → its keys (comments and blank lines left out)."""
    out = {}
    for line in content.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out
