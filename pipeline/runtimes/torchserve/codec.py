"""TorchServe's request bodies: the handlers' JSON (`{"inputs": ...}`), or `.npy`/`.npz`.

The answers (`{"outputs": {name: list}}`) are read by `pipeline.serving.wire.decode`,
which reads every runtime's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from pipeline.serving.client import read_request_file
from pipeline.serving.wire import Body, numpy_body, tensors_body


def encode(inputs: Mapping[str, torch.Tensor], binary: bool = False) -> Body:
    """`inputs` as the handlers' JSON or, `binary`, as `.npy` (one input) / `.npz`."""
    if binary:
        return Body(numpy_body(inputs), {"Content-Type": "application/octet-stream"})
    return Body(tensors_body(inputs), {"Content-Type": "application/json"})


def request_file(path: Path) -> Body:
    """A file as the handler reads it: images, .json, .npy/.npz and torch.save'd tensors."""
    content, content_type = read_request_file(path)
    return Body(content, {"Content-Type": content_type})
