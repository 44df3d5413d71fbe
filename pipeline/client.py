"""A small client for the served models: token, JSON tensors, bounded retries."""

from __future__ import annotations

import functools
import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from pipeline.errors import PipelineError
from pipeline.serve import Server, default_run_dir

# Safe to retry: the request never reached a worker (connection refused/reset)
# or the server said it is temporarily unable (503: a worker restarting, or the
# gateway cannot reach TorchServe). Inference is a pure function, so a request
# whose worker died under it (the gateway answers 503) is safe to send again.
RETRY_STATUS = {503}
RETRIES = 4
BACKOFF_S = 0.25


class ClientError(PipelineError):
    """The server refused a request or could not be reached."""


def tensors_body(inputs: dict[str, torch.Tensor]) -> bytes:
    """Named tensors as the handlers' JSON format (exact for float32: repr round-trips)."""
    return json.dumps(
        {"inputs": {k: v.detach().cpu().tolist() for k, v in inputs.items()}}
    ).encode()


def numpy_body(inputs: dict[str, torch.Tensor]) -> bytes:
    """Named tensors as binary NumPy: one .npy for one input, an .npz otherwise.

    Much cheaper than JSON for big inputs (a 224×224 image: 600 kB instead of 2 MB of text,
    and no number parsing on either side).
    """
    import io

    import numpy as np

    buf = io.BytesIO()
    arrays = {k: v.detach().cpu().numpy() for k, v in inputs.items()}
    if len(arrays) == 1:
        np.save(buf, next(iter(arrays.values())), allow_pickle=False)
    else:
        np.savez(buf, **arrays)
    return buf.getvalue()


def tls_context(server: Server) -> ssl.SSLContext | bool:
    """What httpx verifies the server with: the recorded certificate for HTTPS.

    Plain HTTP gets False rather than httpx's default: building the default
    context loads the whole CA bundle, about 40 ms per call here, which made
    every one-off request (and the bench's first request) look slow.
    """
    if not server.inference_url.startswith("https://"):
        return False
    return _context(server.ca_file) if server.ca_file else True


@functools.lru_cache(maxsize=8)
def _context(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file)


def post(
    server: Server,
    model: str,
    body: bytes,
    content_type: str = "application/json",
    *,
    token: str | None = None,
    timeout: float = 60.0,
    retries: int = RETRIES,
) -> httpx.Response:
    """POST /predictions/<model> with the inference token; retries what is safe to retry."""
    headers = {"Content-Type": content_type}
    token = token if token is not None else server.keys()["inference"]
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{server.inference_url}/predictions/{model}"
    for attempt in range(retries + 1):
        try:
            resp = httpx.post(
                url, content=body, headers=headers, timeout=timeout, verify=tls_context(server)
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as err:
            if attempt == retries:
                raise ClientError(f"Cannot reach {url} after {retries + 1} tries: {err}") from None
        except httpx.TimeoutException:
            # Not retried: the request may have reached a worker and be running.
            raise ClientError(f"{url} did not answer within {timeout:.0f} s.") from None
        except httpx.HTTPError as err:
            raise ClientError(f"Request to {url} failed: {type(err).__name__}: {err}") from None
        else:
            if resp.status_code not in RETRY_STATUS or attempt == retries:
                return resp
        time.sleep(BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def read_request_file(path: Path) -> tuple[bytes, str]:
    """A file to send: an image, a JSON body, or tensors saved with torch.save."""
    path = Path(path)
    if not path.is_file():
        raise ClientError(f"Input file {path} does not exist.")
    suffix = path.suffix.lower()
    if suffix in (".png", ".jpg", ".jpeg"):
        return path.read_bytes(), "image/png" if suffix == ".png" else "image/jpeg"
    if suffix == ".json":
        return path.read_bytes(), "application/json"
    if suffix in (".npy", ".npz"):
        return path.read_bytes(), "application/octet-stream"
    if suffix in (".pt", ".pth"):
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
            raise ClientError(
                f"{path} cannot be read with torch.load(weights_only=True): {err}"
            ) from None
        if isinstance(data, dict) and "inputs" in data:  # a golden file
            data = data["inputs"]
        if isinstance(data, torch.Tensor):
            return json.dumps({"inputs": data.tolist()}).encode(), "application/json"
        if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
            return tensors_body(data), "application/json"
        raise ClientError(f"{path} must hold a tensor or a dict of named tensors.")
    raise ClientError(
        f"Don't know how to send {path}: use .png/.jpg, .json, .npy/.npz, or a torch.save'd .pt."
    )


def resolve_model(server: Server, model: str) -> str:
    """An archive name as given, or the format a model is served in (`digits_lenet` → `digits_lenet_onnx`)."""
    if model in server.models:
        return model
    served = [m for m in server.models if m.rpartition("_")[0] == model]
    if len(served) == 1:
        return served[0]
    if served:  # both formats: TorchScript, the reference serialisation
        return f"{model}_ts" if f"{model}_ts" in served else sorted(served)[0]
    raise ClientError(f"The server does not serve {model}; it serves {', '.join(server.models)}.")


def infer(model: str, input_path: Path, run_dir: Path | None = None) -> Any:
    """Send one file to a served model; return the decoded JSON answer."""
    server = Server.load(Path(run_dir or default_run_dir()))
    model = resolve_model(server, model)
    body, content_type = read_request_file(input_path)
    resp = post(server, model, body, content_type)
    try:
        answer = resp.json()
    except ValueError:
        answer = resp.text
    if resp.status_code != 200:
        raise ClientError(
            f"{model} answered {resp.status_code}: {json.dumps(answer, indent=2) if not isinstance(answer, str) else answer}"
        )
    return answer
