"""The Open Inference Protocol as a `Protocol`, over REST and gRPC: the one implementation
every OIP runtime shares (the KServe runtime, the tests' toy runtime), so a runtime that
speaks OIP writes no route, body or client code of its own."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.serving.protocol import Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from pipeline.serving.server import Server
    from pipeline.serving.wire import Body


class OpenInference(Protocol):
    """The Open Inference Protocol over REST: `POST /v2/models/<name>/infer`, OIP JSON or
    the binary tensor extension (`Inference-Header-Content-Length`)."""

    name = "oip"

    def __init__(
        self, encodings: tuple[str, ...] = ("json", "npy"), transports: tuple[str, ...] = ("rest",)
    ) -> None:
        # A server that reads OIP JSON only (the tests' toy runtime) says so here, and one
        # that also answers OIP's gRPC service (at `server.extras["grpc_url"]`) adds "grpc".
        self.encodings = encodings
        self.transports = transports

    def ready_path(self, name: str) -> str | None:
        return f"/v2/models/{name}/ready"  # the protocol's model readiness

    def infer_path(self, name: str, version: str | None = None) -> str:
        if version:
            return f"/v2/models/{name}/versions/{version}/infer"
        return f"/v2/models/{name}/infer"

    def encode(self, inputs: Mapping[str, torch.Tensor | np.ndarray], binary: bool = False) -> Body:
        from pipeline.serving import wire

        if binary:
            if "npy" not in (self.encodings or ()):
                raise ValueError(f"this server reads the encodings {', '.join(self.encodings)}")
            return wire.oip_binary(inputs)
        return wire.Body(wire.oip_json(inputs), {"Content-Type": "application/json"})

    def request_file(self, server: Server, name: str, path: Path) -> Body:
        """A request file as an OIP request for served `name`, in the datatypes its
        metadata (`GET /v2/models/<name>`) declares. OIP carries tensors, not images."""
        import httpx

        from pipeline.serving import wire
        from pipeline.serving.client import ClientError, read_request_file, server_get

        body, content_type = read_request_file(path)
        if content_type.startswith("image/"):
            raise ClientError(
                f"The Open Inference Protocol carries tensors, not images: send {path.stem}.npy, "
                ".json or .pt (TorchServe's handler decodes images)."
            )
        if content_type == "application/json":
            try:
                parsed = json.loads(body)
            except ValueError as err:
                raise ClientError(f"{path} is not JSON: {err}") from None
            if (
                isinstance(parsed, dict)
                and isinstance(parsed.get("inputs"), list)
                and all(isinstance(i, dict) for i in parsed["inputs"])
            ):
                return wire.Body(body, {"Content-Type": "application/json"})  # already OIP
        kind = "json" if content_type == "application/json" else "npy"
        url = f"{server.inference_url}/v2/models/{name}"
        try:
            meta = server_get(server, url)
            meta.raise_for_status()
            arrays = wire.oip_from_file(body, kind, meta.json()["inputs"])
        except httpx.HTTPError as err:
            raise ClientError(f"Cannot read {name}'s metadata from {url}: {err}") from None
        except (ValueError, KeyError, TypeError, OSError) as err:
            raise ClientError(f"{path} cannot be sent to {name}: {err}") from None
        if "npy" in (self.encodings or ()):
            return wire.oip_binary(arrays)
        return wire.Body(wire.oip_json(arrays), {"Content-Type": "application/json"})

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
        """Over REST: OIP JSON tensors, or the binary extension when they are big
        (wants_binary) and the server reads it. Over gRPC: `infer_grpc`."""
        from pipeline.serving import client
        from pipeline.serving.protocol import refused_answer, wants_binary

        if transport not in self.transports:
            raise ValueError(f"this server speaks OIP over {', '.join(self.transports)}")
        if transport == "grpc":
            url = server.extras["grpc_url"]
            return self.infer_grpc(server, name, inputs, url, timeout=timeout, version=version)

        body = self.encode(inputs, binary=wants_binary(inputs) and self.reads_binary())
        extra = {k: v for k, v in body.headers.items() if k != "Content-Type"}
        resp = client.post(
            server,
            name,
            body.content,
            body.content_type,
            timeout=timeout,
            retries=0,
            headers=extra,
            version=version,
        )
        if resp.status_code != 200:
            raise refused_answer(resp.status_code, resp.text)
        return self.answer(resp)

    def decode(
        self, content: bytes, headers: Mapping[str, str] | None = None
    ) -> dict[str, torch.Tensor]:
        from pipeline.serving.wire import decode_oip

        return decode_oip(content, headers)

    def infer_grpc(
        self,
        server: Server,
        name: str,
        inputs: Mapping[str, torch.Tensor],
        grpc_url: str,
        *,
        timeout: float = 120.0,
        version: str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Over gRPC (the OIP service at `grpc_url`, TLS when the server serves HTTPS): raw
        little-endian bytes (`raw_input_contents`), the token in the `authorization`
        metadata. kserve's generated stub; the messages are `pipeline_runtime.oip`'s."""
        import grpc
        import torch

        from pipeline.core.errors import TooLargeError
        from pipeline_runtime import oip

        stubs = oip.kserve_module("kserve.protocol.grpc.grpc_predict_v2_pb2_grpc")
        request = oip.Request(
            tuple(oip.Tensor.from_array(k, t.contiguous().numpy()) for k, t in inputs.items()),
            model_name=name,
            model_version=version,
        ).to_grpc()
        if server.inference_url.startswith("https://"):
            ca = Path(server.ca_file).read_bytes() if server.ca_file else None
            creds = grpc.ssl_channel_credentials(root_certificates=ca)
            channel = grpc.secure_channel(grpc_url, creds)
        else:
            channel = grpc.insecure_channel(grpc_url)
        token = server.keys()["inference"]
        with channel:
            try:
                reply = stubs.GRPCInferenceServiceStub(channel).ModelInfer(
                    request, metadata=(("authorization", f"Bearer {token}"),), timeout=timeout
                )
            except grpc.RpcError as err:  # over the message size limit: as REST's 413
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise TooLargeError(f"{err.code()}: {err.details()}") from None
                raise
        response = oip.Response.from_grpc(reply)
        return {t.name: torch.from_numpy(t.as_numpy().copy()) for t in response.outputs}


# The KServe runtime's: OIP over REST and gRPC, JSON and the binary extension.
OIP = OpenInference(transports=("rest", "grpc"))
