"""TorchServe's wire, client side: the handler's JSON (`{"inputs": ...}`) or `.npy`/`.npz`
out, its answers (`{"outputs": {name: list}}`) back. The handler's side of the same
wire is pipeline_runtime.codec (shipped in every archive).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from pipeline.serving.client import read_request_file
from pipeline.serving.wire import Body, WireError, numpy_body, tensors_body


def encode(inputs: Mapping[str, torch.Tensor], binary: bool = False) -> Body:
    """`inputs` as the handlers' JSON or, `binary`, as `.npy` (one input) / `.npz`."""
    if binary:
        return Body(numpy_body(inputs), {"Content-Type": "application/octet-stream"})
    return Body(tensors_body(inputs), {"Content-Type": "application/json"})


def request_file(path: Path) -> Body:
    """A file as the handler reads it: images, .json, .npy/.npz and torch.save'd tensors."""
    content, content_type = read_request_file(path)
    return Body(content, {"Content-Type": content_type})


def decode(content: bytes) -> dict[str, torch.Tensor]:
    """The handler's answer → named output tensors. Its JSON carries no dtypes: floats
    come back float32, integers int64 (the caller casts to the manifest's). WireError for
    any other body, an Open Inference Protocol answer included (the handler answers in
    OIP only to OIP requests, which this protocol never sends)."""
    try:
        outputs = json.loads(content)["outputs"]
    except (ValueError, KeyError, TypeError) as err:
        raise WireError(f"Not a TorchServe handler answer: {type(err).__name__}: {err}") from None
    if not isinstance(outputs, dict):
        raise WireError(f"'outputs' must be an object of named lists, got {outputs!r:.80}.")
    try:
        return {str(k): torch.tensor(v) for k, v in outputs.items()}
    except (ValueError, TypeError, RuntimeError) as err:
        raise WireError(f"Unreadable outputs: {type(err).__name__}: {err}") from None
