"""The one HTTP client of a running server: URLs, token, TLS, bodies and the retry policy.

Everything that talks to a server `pipeline serve` started goes through
here: `pipeline infer`, verify's served backends (parity.py), loadtest,
`pipeline bench`'s served measurements, and serve's own warm-up, scaling
and readiness checks. `Client` sends one request at a time, `AsyncClient`
many at once from one asyncio loop; both apply the same policy and return
an `Answer`. `post()` is the one-call form.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import torch
from aiohttp.http_exceptions import ContentLengthError, TransferEncodingError

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.serving import runtime
from pipeline.serving.server import Server, default_run_dir

# The bodies' builders live in wire; callers of client.numpy_body/tensors_body keep working.
from pipeline.serving.wire import numpy_body, tensors_body  # noqa: F401

# Safe to resend: the request never reached a worker (connection refused or
# reset) or the server said it is temporarily unable (503: a worker
# restarting, or the gateway cannot reach TorchServe). Inference is a pure
# function, so a request whose worker died under it (the gateway answers 503,
# or the answer stops after its headers) is safe to send again. A timeout is not resent: the request may be running.
RETRY_STATUS = {503}
RESENDABLE = (
    httpx.ConnectError,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    aiohttp.ClientConnectionError,  # refused, reset or disconnected (AsyncClient)
)
# aiohttp's word for a body cut short by the connection closing (a worker killed between
# the headers and the body): httpx calls the same event RemoteProtocolError, resent above.
CUT_SHORT = (ContentLengthError, TransferEncodingError)
RETRIES = 4
BACKOFF_S = 0.25
MAX_BACKOFF_S = 2.0


class ClientError(PipelineError):
    """The server refused a request or could not be reached."""


def backoff_s(attempt: int) -> float:
    """The pause before resend number `attempt + 1`: doubling, capped."""
    return min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S)


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


def _headers(server: Server, api: str, token: str | None = None) -> dict[str, str]:
    token = token if token is not None else server.keys()[api]
    return {"Authorization": f"Bearer {token}"} if token else {}


def prediction_url(server: Server, model: str, version: str | None = None) -> str:
    """The inference URL of `model` (of its `version`) on `server`, in its runtime's
    protocol."""
    return server.inference_url + runtime.of(server).protocol.infer_path(model, version)


@dataclass
class Answer:
    """What one request came to after the retry policy: a response, or why there is none."""

    response: httpx.Response | None
    retries: int = 0  # resends the policy made
    problem: str = ""  # empty when the server answered 200

    @property
    def ok(self) -> bool:
        return self.response is not None and self.response.status_code == 200


def _outcome(
    url: str, resp: httpx.Response | None, err: Exception | None, timeout: float
) -> tuple[bool, str]:
    """(resend?, problem) for one attempt."""
    if isinstance(err, httpx.TimeoutException | TimeoutError):
        return False, f"{url} did not answer within {timeout:.0f} s."
    if isinstance(err, RESENDABLE) or _cut_short(err):
        return True, f"Cannot reach {url}: {type(err).__name__}: {err}"
    if err is not None:
        return False, f"Request to {url} failed: {type(err).__name__}: {err}"
    assert resp is not None
    problem = (
        ""
        if resp.status_code == 200
        else f"HTTP {resp.status_code}: {' '.join(resp.text.split())[:300]}"
    )
    return resp.status_code in RETRY_STATUS, problem


def _cut_short(err: Exception | None) -> bool:
    """Whether aiohttp lost the connection mid-body (fewer bytes than the length the
    headers gave). Not any ClientPayloadError: a redirect's or a decoding failure would
    come back the same on a resend."""
    return isinstance(err, aiohttp.ClientPayloadError) and isinstance(err.__cause__, CUT_SHORT)


class Client:
    """Requests to one server, one at a time, over one connection pool."""

    def __init__(
        self,
        server: Server,
        *,
        timeout: float = 60.0,
        retries: int = RETRIES,
        token: str | None = None,
    ) -> None:
        self.server, self.timeout, self.retries = server, timeout, retries
        self.headers = _headers(server, "inference", token)
        self._http = httpx.Client(timeout=timeout, verify=tls_context(server))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def send(
        self,
        model: str,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        version: str | None = None,
    ) -> Answer:
        """POST to `model`'s inference route (its `version`'s); resends what is safe to
        resend. `headers` adds protocol headers (the OIP binary extension's header length)."""
        url = prediction_url(self.server, model, version)
        headers = {**self.headers, **(headers or {}), "Content-Type": content_type}
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(backoff_s(attempt - 1))
            resp, err = None, None
            try:
                resp = self._http.post(url, content=body, headers=headers)
            except httpx.HTTPError as e:
                err = e
            resend, problem = _outcome(url, resp, err, self.timeout)
            if not resend or attempt == self.retries:
                return Answer(resp, attempt, problem)
        raise AssertionError("unreachable")  # pragma: no cover


class AsyncClient:
    """Many concurrent requests to one server from one asyncio loop (loadtest, bench).

    aiohttp, not httpx: at concurrency 8 httpx's async client spent about
    twice the CPU per request here, on the cores the server under test
    shares, and capped what loadtest and bench could measure (same run: 280
    against 515 requests/s from one loop). Answers are handed back as
    httpx responses, so callers read them as they read `Client`'s.
    """

    def __init__(
        self, server: Server, *, concurrency: int, timeout: float = 60.0, retries: int = 0
    ) -> None:
        self.server, self.timeout, self.retries = server, timeout, retries
        self.headers = _headers(server, "inference")
        self.concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncClient:
        verify = tls_context(self.server)
        connector = aiohttp.TCPConnector(
            limit=self.concurrency, ssl=verify if isinstance(verify, ssl.SSLContext) else True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def sender(
        self,
        model: str,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> Callable[[], Awaitable[bool]]:
        """One request to send again and again (bench's load): the URL and headers built
        once, the answer read and dropped, no retries; each call says whether it was a 200.
        As lean as a plain aiohttp client: `send` builds an httpx response per answer,
        which halved what bench's yardstick reached at concurrency 8 (issue 40)."""
        assert self._session is not None, "use `async with AsyncClient(...)`"
        session, url = self._session, prediction_url(self.server, model)
        sent = {**self.headers, **(headers or {})}
        if content_type:
            sent["Content-Type"] = content_type
        skip = () if content_type else ("Content-Type",)

        async def send() -> bool:
            try:
                async with session.post(url, data=body, headers=sent, skip_auto_headers=skip) as r:
                    await r.read()
                    return r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

        return send

    async def send(
        self,
        model: str,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """As `Client.send`; an empty `content_type` sends no Content-Type at all."""
        assert self._session is not None, "use `async with AsyncClient(...)`"
        url = prediction_url(self.server, model)
        headers = {**self.headers, **(headers or {})}
        if content_type:
            headers["Content-Type"] = content_type
        skip = () if content_type else ("Content-Type",)
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(backoff_s(attempt - 1))
            resp, err = None, None
            try:
                async with self._session.post(
                    url, data=body, headers=headers, skip_auto_headers=skip
                ) as r:
                    content = await r.read()
                resp = httpx.Response(
                    r.status,
                    headers=list(r.headers.items()),
                    content=content,
                    request=httpx.Request("POST", url),
                )
            except (aiohttp.ClientError, TimeoutError) as e:
                err = e
            resend, problem = _outcome(url, resp, err, self.timeout)
            if not resend or attempt == self.retries:
                return Answer(resp, attempt, problem)
        raise AssertionError("unreachable")  # pragma: no cover


def post(
    server: Server,
    model: str,
    body: bytes,
    content_type: str = "application/json",
    *,
    token: str | None = None,
    timeout: float = 60.0,
    retries: int = RETRIES,
    headers: dict[str, str] | None = None,
    version: str | None = None,
) -> httpx.Response:
    """POST to `model`'s inference route with the inference token; the server's answer,
    whatever its status. ClientError when there is none (unreachable after the retries, or
    a timeout)."""
    with Client(server, timeout=timeout, retries=retries, token=token) as client:
        answer = client.send(model, body, content_type, headers, version)
    if answer.response is None:
        raise ClientError(answer.problem)
    return answer.response


def auth_headers(server: Server, api: str) -> dict[str, str]:
    """The Authorization header for `server`'s `api` (its recorded key: "inference", or
    one of the runtime's own, `Server.key_files`), or none."""
    return _headers(server, api)


def server_get(server: Server, url: str, timeout: float = 10.0) -> httpx.Response:
    """A GET on `server` (metadata, health) with the inference token and its TLS trust."""
    return httpx.get(
        url, headers=_headers(server, "inference"), verify=tls_context(server), timeout=timeout
    )


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
        if isinstance(data, (list, tuple)):  # the C++ client's positional form
            raise ClientError(
                f"{path} holds a list of {len(data)}; a server takes inputs by name: save a "
                "dict named by the export's inputs (its manifest.json lists them), e.g. "
                "torch.save({'x': x, 'h': h}, path)."
            )
        raise ClientError(f"{path} must hold a tensor or a dict of named tensors.")
    raise ClientError(
        f"Don't know how to send {path}: use .png/.jpg, .json, .npy/.npz, or a torch.save'd .pt."
    )


def resolve_model(server: Server, model: str, fmt: str | None = None) -> str:
    """The served name for `model`: a served name as given, or that of a model
    (as its export names it, or by its folder name: my_model_MyModel for
    models/my_model.py:MyModel, as `pipeline serve --models` takes it) that serve recorded,
    in format `fmt` or, when the model is served in several, the first in registry order
    (TorchScript, the reference)."""
    if model in server.models and fmt is None:
        return model
    found = server.served_of(model)
    if not found:
        by_slug = {paths.model_slug(info.model): info.model for info in server.served.values()}
        if model in by_slug:
            found = server.served_of(by_slug[model])
    if fmt is not None:
        found = {name: info for name, info in found.items() if info.format == fmt}
    if found:
        return next(iter(found))  # served_of lists them in registry order
    what = f"{model} as {fmt}" if fmt else model
    raise ClientError(f"The server does not serve {what}; it serves {', '.join(server.models)}.")


def infer(model: str, input_path: Path, run_dir: Path | None = None) -> Any:
    """Send one file to a served model; return the decoded JSON answer."""
    server = Server.load(Path(run_dir or default_run_dir()))
    model = resolve_model(server, model)
    request = runtime.of(server).protocol.request_file(server, model, Path(input_path))
    resp = post(server, model, request.content, request.content_type, headers=request.headers)
    try:
        answer = resp.json()
    except ValueError:
        answer = resp.text
    if resp.status_code != 200:
        raise ClientError(
            f"{model} answered {resp.status_code}: {json.dumps(answer, indent=2) if not isinstance(answer, str) else answer}"
        )
    return answer
