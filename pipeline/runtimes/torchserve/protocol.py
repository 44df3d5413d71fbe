"""TorchServe's wire protocol: `POST /predictions/<archive>` through the gateway.

Bodies are the handler's: JSON (plain nested lists, named tensors, or OIP JSON),
`.npy`/`.npz` files, images and forms; the gateway recognises a body by its bytes, so
loadtest also sends them untyped or as a form, as curl does by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.serving.protocol import Protocol, refused_answer

if TYPE_CHECKING:
    import torch

    from pipeline.serving.server import Server
    from pipeline.serving.wire import Body


class TorchServeProtocol(Protocol):
    name = "predictions"  # TorchServe's inference API
    encodings = None  # every encoding loadtest knows

    def infer_path(self, name: str, version: str | None = None) -> str:
        # TorchServe's own version route: /predictions/<name>/<version>
        return f"/predictions/{name}/{version}" if version else f"/predictions/{name}"

    def encode(self, inputs: Mapping[str, torch.Tensor], binary: bool = False) -> Body:
        from pipeline.runtimes.torchserve.codec import encode

        return encode(inputs, binary)

    def encode_as(self, body: Body, content_type: str | None) -> Body:
        from pipeline.serving.wire import Body

        # The gateway also reads bodies sent untyped or as a form (curl's defaults).
        return Body(body.content, {"Content-Type": content_type} if content_type else {})

    def decode(
        self, content: bytes, headers: Mapping[str, str] | None = None
    ) -> dict[str, torch.Tensor]:
        from pipeline.runtimes.torchserve.codec import decode

        return decode(content)

    def request_file(self, server: Server, name: str, path: Path) -> Body:
        from pipeline.runtimes.torchserve.codec import request_file

        return request_file(path)

    def infer(
        self,
        server: Server,
        name: str,
        inputs: Mapping[str, torch.Tensor],
        *,
        timeout: float = 120.0,
        version: str | None = None,
        transport: str = "rest",
    ) -> dict[str, torch.Tensor]:
        """Over REST, its one transport: named tensors as the handler's JSON (`.npy`/`.npz` when big: wants_binary); its
        `outputs`, by name, as JSON read them (float64, int64, bool: the caller casts them
        to the manifest's dtypes)."""
        import numpy as np
        import torch

        from pipeline.serving.client import post
        from pipeline.serving.protocol import wants_binary

        body = self.encode(inputs, binary=wants_binary(inputs))
        resp = post(
            server,
            name,
            body.content,
            body.content_type,
            timeout=timeout,
            retries=0,
            version=version,
        )
        if resp.status_code != 200:
            raise refused_answer(resp.status_code, resp.text)
        # numpy keeps JSON's numbers whole (float64, int64, bool) until the caller casts.
        return {k: torch.from_numpy(np.asarray(v)) for k, v in resp.json()["outputs"].items()}


PROTOCOL = TorchServeProtocol()
