"""TorchServe's wire protocol: `POST /predictions/<archive>` through the gateway.

Bodies are the handler's: JSON (plain nested lists, named tensors, or OIP JSON),
`.npy`/`.npz` files, images and forms; the gateway recognises a body by its bytes, so
loadtest also sends them untyped or as a form, as curl does by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.serving.protocol import Protocol

if TYPE_CHECKING:
    import torch

    from pipeline.serving.server import Server
    from pipeline.serving.wire import Body


class TorchServeProtocol(Protocol):
    name = "predictions"  # TorchServe's inference API
    encodings = None  # every encoding loadtest knows

    def infer_path(self, name: str) -> str:
        return f"/predictions/{name}"

    def encode(self, inputs: Mapping[str, torch.Tensor], binary: bool = False) -> Body:
        from pipeline.runtimes.torchserve.codec import encode

        return encode(inputs, binary)

    def encode_as(self, body: Body, content_type: str | None) -> Body:
        from pipeline.serving.wire import Body

        # The gateway also reads bodies sent untyped or as a form (curl's defaults).
        return Body(body.content, {"Content-Type": content_type} if content_type else {})

    def request_file(self, server: Server, name: str, path: Path) -> Body:
        from pipeline.runtimes.torchserve.codec import request_file

        return request_file(path)


PROTOCOL = TorchServeProtocol()
