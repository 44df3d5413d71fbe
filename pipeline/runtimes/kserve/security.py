"""The KServe runtime's front door: token, body size, allowed routes, JSON errors.

kserve 0.21's ModelServer has none of these (see
docs/notes/kserve-runtime-research.md §2.4-2.8), so the runtime adds them:

* `Guard`, a raw ASGI middleware in front of the FastAPI app: only the Open
  Inference Protocol routes and /metrics exist (no /v1, no /openapi.json, no
  repository load/unload); every route but the health checks needs
  `Authorization: Bearer <inference key>` (401 JSON with `WWW-Authenticate`);
  a body whose Content-Length exceeds the limit is refused with a JSON 413
  before it is read, and a chunked one as soon as it passes the limit; a body sent with
  `Content-Encoding: gzip` or `deflate` is decoded here, its decoded size under the same
  limit (a decompression bomb is a 413, never held whole), and another encoding is a 415;
  /metrics follows Prometheus's habits instead: open where the runtime listens on
  loopback (scrapes carry no token), elsewhere it needs the metrics key from
  `metrics_key.json`, never the inference token (a scraper's credential must not
  run the models; SECURITY.md);
* `TokenInterceptor`, the same token check for gRPC (UNAUTHENTICATED).

The token, body-limit and error decisions are `pipeline.serving.guard`'s (shared
with the TorchServe gateway); this module adapts them to ASGI and gRPC. Errors
have the Open Inference Protocol's shape, `{"error": "..."}`.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import grpc

from pipeline.runtimes.kserve.constants import METRICS_KEY_FILE
from pipeline.serving.guard import (
    WWW_AUTHENTICATE,
    BodyLimit,
    Keys,
    Refusal,
    check_token,
    decode_body,
    oip_shape,
    unsupported_encoding,
)
from pipeline_runtime import tracing

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
_RECODED = (b"content-encoding", b"content-length")  # replaced once a body is decoded
METRICS_PATH = "/metrics"
METRICS_TOKEN_REQUIRED = (
    "A valid metrics token is required on /metrics when the runtime listens off loopback: "
    "send 'Authorization: Bearer <key>' with the 'metrics' key from the server's "
    "metrics_key.json (the inference token is not accepted here)."
)
_NAME = r"[A-Za-z0-9_.\-]+"
ALLOWED = (
    ("GET", re.compile(r"/v2/health/(live|ready)")),
    ("GET", re.compile(r"/v2")),
    ("GET", re.compile(r"/metrics")),
    ("GET", re.compile(rf"/v2/models/{_NAME}(/versions/{_NAME})?(/ready)?")),
    ("POST", re.compile(rf"/v2/models/{_NAME}(/versions/{_NAME})?/infer")),
)
# gRPC methods answered without a token (the health checks).
OPEN_RPCS = frozenset(
    {"/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/ServerReady"}
)


async def send_refusal(send: Send, refusal: Refusal, *, close: bool = False) -> None:
    """The guard's refusal as an ASGI response (`close`: the unread body ends the connection)."""
    body = refusal.json(oip_shape)
    headers = {**refusal.headers, **({"Connection": "close"} if close else {})}
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in headers.items()),
    ]
    await send({"type": "http.response.start", "status": refusal.status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _allowed(method: str, path: str) -> tuple[bool, bool]:
    """→ (the path exists, the method is right for it)."""
    matched = [m for m, rx in ALLOWED if rx.fullmatch(path)]
    return bool(matched), (method in matched or (method == "HEAD" and "GET" in matched))


def is_loopback(host: str | None) -> bool:
    """Whether `host` (a listening or local address) is this machine's loopback: 127.0.0.0/8,
    ::1 (also IPv4-mapped, as a dual-stack socket reports it) or `localhost`."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class Guard:
    """ASGI middleware: allowed routes, token, body size (see the module doc).

    `host`: the address the runtime listens on, which decides /metrics (open on loopback,
    else the metrics key). Not given, the guard decides per connection from the local
    address it arrived on (ASGI's `scope["server"]`): the same answer for a runtime bound
    to one address; on a wildcard bind (0.0.0.0, ::) a scrape through 127.0.0.1 is open.
    `metrics_keys`: default, `metrics_key.json` beside the inference key file.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: Keys | None,
        max_body: int,
        host: str | None = None,
        metrics_keys: Keys | None = None,
    ) -> None:
        self.app = app
        self.keys = keys  # None: no token (tests that say so)
        self.limit = BodyLimit(max_body)
        self.loopback = None if host is None else is_loopback(host)
        if metrics_keys is None and keys is not None:
            metrics_keys = Keys(keys.path.with_name(METRICS_KEY_FILE), kind="metrics")
        self.metrics_keys = metrics_keys

    def _check_metrics(self, scope: Scope) -> Refusal | None:
        """/metrics: open without keys or on loopback; else the metrics key alone."""
        if self.keys is None:
            return None  # no token anywhere (a pod behind its mesh)
        loopback = self.loopback
        if loopback is None:
            loopback = is_loopback((scope.get("server") or ("",))[0])
        if loopback:
            return None
        if self.metrics_keys is not None and self.metrics_keys.accepts(
            _header(scope, b"authorization")
        ):
            return None
        return Refusal(
            401, "Unauthorized", METRICS_TOKEN_REQUIRED, {"WWW-Authenticate": WWW_AUTHENTICATE}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        path = scope.get("path", "")
        method = scope.get("method", "GET")
        exists, right_method = _allowed(method, path)
        refusal = None
        if not exists:
            refusal = Refusal(404, "NotFound", f"No such route: {path}")
        elif path == METRICS_PATH:
            refusal = self._check_metrics(scope)
        elif path not in OPEN_PATHS:
            refusal = check_token(self.keys, _header(scope, b"authorization"))
        if refusal is None and not right_method:
            refusal = Refusal(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
        if tracing.TRACING is not None:
            status = "ok" if refusal is None else str(refusal.status)
            tracing.TRACING.record("auth", began, time.perf_counter(), {"auth.result": status})
        length = _header(scope, b"content-length")
        encoding = _header(scope, b"content-encoding")
        if refusal is None:
            refusal = self.limit.check_declared(length) or unsupported_encoding(encoding)
        if refusal is not None:
            await send_refusal(send, refusal, close=refusal.status in (413, 415))
            return
        encoded = encoding is not None and encoding.strip().lower() not in ("identity", "")
        if (length is not None and not encoded) or method not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        # Chunked (no Content-Length) or encoded: read it here, counting, then replay it.
        try:
            body = await self.limit.read(_chunks(receive))
        except _ClientGoneError:
            return  # the client went away
        if isinstance(body, Refusal):
            await send_refusal(send, body, close=True)
            return
        if encoded:  # decoded here, bounded by the same limit: the app sees a plain body
            body = decode_body(body, encoding, self.limit)
            if isinstance(body, Refusal):
                await send_refusal(send, body, close=body.status == 413)
                return
            kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _RECODED]
            scope = {**scope, "headers": [*kept, (b"content-length", str(len(body)).encode())]}
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _ClientGoneError(Exception):
    """The client disconnected before its body had arrived."""


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    """An ASGI request body, message by message."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientGoneError
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses gRPC calls without the inference token (UNAUTHENTICATED)."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        if details.method in OPEN_RPCS:
            return await continuation(details)
        header = next(
            (v for k, v in (details.invocation_metadata or ()) if k.lower() == "authorization"),
            None,
        )
        if isinstance(header, bytes):
            header = header.decode("latin-1")
        if self.keys.accepts(header):
            return await continuation(details)

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "A valid inference token is required: send metadata 'authorization: Bearer <key>'.",
            )

        deny.auth_result = "UNAUTHENTICATED"  # type: ignore[attr-defined]  # traced.py's auth span
        return grpc.unary_unary_rpc_method_handler(deny)
