"""The Ray ingress's answer: the outputs a request asked for, each in JSON or binary.

The Open Inference Protocol answers with the outputs the request names in its `outputs`
(all of them when it names none), and the binary extension chooses JSON or binary per
output (`binary_data`, defaulting to the request's `binary_data_output`). The KServe
runtime's fast path does the same (pipeline/runtimes/kserve/fastpath.encode); a name the
model does not have is the client's error, refused before the model runs.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pipeline_runtime import oip


class UnknownOutputError(ValueError):
    """A request asked for an output the model does not have."""


def asked(request: oip.Request, outputs: list[str]) -> dict[str, dict[str, Any]]:
    """The outputs `request` names, with their parameters; UnknownOutputError for a name that
    is not among the model's `outputs`."""
    wanted = {o["name"]: o.get("parameters") or {} for o in request.outputs}
    unknown = sorted(set(wanted) - set(outputs))
    if unknown:
        raise UnknownOutputError(f"No output named {unknown}; this model has {outputs}.")
    return wanted


def encode(
    request: oip.Request, meta: dict[str, str], names: list[str], arrays: list[np.ndarray]
) -> tuple[bytes, int | None]:
    """The REST answer (JSON, or the binary extension's header + bytes and the header's
    length) to `request` from the model's outputs; `meta` is model_name and model_version."""
    tensors = {n: oip.Tensor.from_array(n, a) for n, a in zip(names, arrays, strict=True)}
    wanted = asked(request, names)
    default = bool(request.parameters.get("binary_data_output", False))
    chosen = [
        (tensors[n], bool(wanted.get(n, {}).get("binary_data", default))) for n in wanted or tensors
    ]
    header = {**meta, **({"id": request.id} if request.id is not None else {})}
    header["outputs"] = [t.to_json(binary) for t, binary in chosen]
    head = json.dumps(header).encode()
    tails = [t.raw() for t, binary in chosen if binary]
    return (head + b"".join(tails), len(head)) if tails else (head, None)
