"""The shared guard (pipeline.serving.guard) and both of its adapters, in-process.

The TorchServe gateway is driven through aiohttp's TestClient/TestServer with a
stand-in upstream; the KServe runtime's ASGI `Guard` through httpx's
ASGITransport around a tiny ASGI app (no kserve import: it parses sys.argv).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline.runtimes.kserve.security import Guard, TokenInterceptor
from pipeline.runtimes.torchserve.gateway import (
    GatewayConfig,
    build_app,
    torchserve_shape,
)
from pipeline.serving.guard import (
    WWW_AUTHENTICATE,
    BodyLimit,
    Keys,
    Refusal,
    check_token,
    oip_shape,
)

LIMIT = 1024
WRONG_TOKENS = (None, "", "Bearer", "Bearer wrong", "Basic k", "k", "Bearer kk")


def _key_file(path: Path, key: str) -> Path:
    path.write_text(json.dumps({"inference": {"key": key}, "management": {"key": "m"}}))
    return path


def _auth(header: str | None) -> dict[str, str]:
    return {} if header is None else {"Authorization": header}


# --- the shared core -----------------------------------------------------------------------------


def test_bearer_token_is_checked_exactly(tmp_path: Path) -> None:
    keys = Keys(_key_file(tmp_path / "key_file.json", "s3cret"))
    assert keys.accepts("Bearer s3cret")
    assert keys.accepts("bearer s3cret")  # the scheme is case-insensitive (RFC 7235)
    for header in (None, "", "Bearer", "Bearer s3cre", "Bearer s3crett", "Basic s3cret", "s3cret"):
        assert not keys.accepts(header), header


def test_a_rotated_key_is_picked_up(tmp_path: Path) -> None:
    path = _key_file(tmp_path / "key_file.json", "old")
    keys = Keys(path)
    assert keys.accepts("Bearer old")
    _key_file(path, "new-key")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert keys.accepts("Bearer new-key")
    assert not keys.accepts("Bearer old")


def test_no_key_file_accepts_nothing(tmp_path: Path) -> None:
    keys = Keys(tmp_path / "missing.json")
    assert not keys.accepts("Bearer ")
    assert not keys.accepts("Bearer anything")


def test_a_refused_token_is_a_401_with_www_authenticate(tmp_path: Path) -> None:
    keys = Keys(_key_file(tmp_path / "key_file.json", "k"))
    assert check_token(keys, "Bearer k") is None
    assert check_token(None, None) is None  # no key file: nothing to check
    for header in WRONG_TOKENS:
        refusal = check_token(keys, header)
        assert refusal is not None, header
        assert (refusal.status, refusal.kind) == (401, "Unauthorized")
        assert dict(refusal.headers) == {"WWW-Authenticate": 'Bearer realm="pipeline"'}
        assert "inference token" in refusal.message


def test_the_body_limit_decides_from_a_declared_length() -> None:
    limit = BodyLimit(LIMIT)
    assert limit.check_declared(None) is None  # chunked: decided while it streams
    assert limit.check_declared(LIMIT) is None
    assert limit.check_declared("0") is None
    over = limit.check_declared(str(LIMIT + 1))
    assert over is not None and (over.status, over.kind) == (413, "RequestEntityTooLarge")
    assert f"limit of {LIMIT} bytes (max_request_size)" in over.message
    assert "--max-request-size" in over.message
    bad = limit.check_declared("12x")
    assert bad is not None and bad.status == 400


def test_a_streamed_body_stops_being_read_once_it_passes_the_limit() -> None:
    pulled = 0

    async def chunks(n: int, size: int) -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(n):
            pulled += 1
            yield b"x" * size

    limit = BodyLimit(LIMIT)
    assert asyncio.run(limit.read(chunks(4, LIMIT // 4))) == b"x" * LIMIT  # at the limit: fine
    pulled = 0
    refused = asyncio.run(limit.read(chunks(10, 400)))
    assert isinstance(refused, Refusal) and refused.status == 413
    assert pulled == 3  # 1,200 bytes passed 1,024: the other 7 chunks were never asked for
    assert "(1200 bytes or more)" in refused.message


def test_each_runtime_keeps_its_error_shape() -> None:
    refusal = Refusal(413, "RequestEntityTooLarge", "too big")
    assert torchserve_shape(refusal) == {
        "code": 413,
        "type": "RequestEntityTooLarge",
        "message": "too big",
    }
    assert oip_shape(refusal) == {"error": "too big"}
    assert json.loads(refusal.json(oip_shape)) == {"error": "too big"}


# --- the TorchServe gateway (aiohttp) ------------------------------------------------------------


def _gateway_scenario(tmp_path: Path, client_calls: Any) -> tuple[Any, list[str]]:
    """Runs `client_calls(gateway)` against the gateway in front of a stand-in upstream;
    → (what it returned, the paths the upstream was asked for)."""
    seen: list[str] = []

    async def upstream(request: web.Request) -> web.Response:
        seen.append(request.path)
        await request.read()
        return web.json_response({"status": "Healthy"})

    async def main() -> Any:
        up = web.Application()
        up.router.add_route("*", "/{tail:.*}", upstream)
        async with TestServer(up) as up_server:
            config = GatewayConfig(
                host="127.0.0.1",
                port=0,
                upstream=str(up_server.make_url("")).rstrip("/"),
                key_file=str(_key_file(tmp_path / "key_file.json", "k")),
                max_request_size=LIMIT,
            )
            async with TestClient(TestServer(build_app(config))) as gateway:
                return await asyncio.wait_for(client_calls(gateway), 10)

    return asyncio.run(main()), seen


async def _answer(resp: Any) -> tuple[int, dict[str, str], Any]:
    return resp.status, dict(resp.headers), await resp.json()


def _torchserve_error(status: int, headers: dict[str, str], body: Any, code: int) -> None:
    assert status == code, body
    assert headers["Content-Type"].startswith("application/json")
    assert set(body) == {"code", "type", "message"} and body["code"] == code


def test_the_gateway_wants_the_token_and_leaves_ping_open(tmp_path: Path) -> None:
    async def calls(gateway: TestClient) -> list[Any]:
        out = []
        for header in WRONG_TOKENS:
            resp = await gateway.post("/predictions/m", data=b"{}", headers=_auth(header))
            out.append(await _answer(resp))
        out.append(await _answer(await gateway.get("/ping")))
        resp = await gateway.post("/predictions/m", data=b"{}", headers=_auth("Bearer k"))
        out.append(await _answer(resp))
        return out

    answers, seen = _gateway_scenario(tmp_path, calls)
    for status, headers, body in answers[: len(WRONG_TOKENS)]:
        _torchserve_error(status, headers, body, 401)
        assert headers["WWW-Authenticate"] == WWW_AUTHENTICATE
        assert body["type"] == "Unauthorized" and "inference token" in body["message"]
    assert [a[0] for a in answers[len(WRONG_TOKENS) :]] == [200, 200]
    assert seen == ["/ping", "/predictions/m"]  # refused requests never reached TorchServe


def test_the_gateway_refuses_a_declared_length_over_the_limit_before_reading(
    tmp_path: Path,
) -> None:
    async def calls(gateway: TestClient) -> Any:
        async def first_chunk_only() -> AsyncIterator[bytes]:
            yield b"x" * 100
            await asyncio.Event().wait()  # the rest never comes: only an early answer ends this

        resp = await gateway.post(
            "/predictions/m",
            data=first_chunk_only(),
            headers={"Authorization": "Bearer k", "Content-Length": str(LIMIT + 1)},
        )
        return await _answer(resp)

    (status, headers, body), seen = _gateway_scenario(tmp_path, calls)
    _torchserve_error(status, headers, body, 413)
    assert body["type"] == "RequestEntityTooLarge" and "max_request_size" in body["message"]
    assert seen == []


def test_the_gateway_refuses_a_chunked_body_once_it_passes_the_limit(tmp_path: Path) -> None:
    async def calls(gateway: TestClient) -> Any:
        async def over_then_stall() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"x" * 400  # 1,200 bytes: over the limit
            await asyncio.Event().wait()  # a gateway waiting for the end would hang here

        resp = await gateway.post(
            "/predictions/m", data=over_then_stall(), headers={"Authorization": "Bearer k"}
        )
        return await _answer(resp)

    (status, headers, body), seen = _gateway_scenario(tmp_path, calls)
    _torchserve_error(status, headers, body, 413)
    assert "max_request_size" in body["message"]
    assert seen == []


def test_the_gateway_answers_unknown_routes_and_methods_in_json(tmp_path: Path) -> None:
    async def calls(gateway: TestClient) -> list[Any]:
        auth = {"Authorization": "Bearer k"}
        return [
            await _answer(await gateway.get("/models", headers=auth)),
            await _answer(await gateway.get("/predictions/m", headers=auth)),
        ]

    (missing, wrong_method), seen = _gateway_scenario(tmp_path, calls)
    _torchserve_error(*missing, 404)
    _torchserve_error(*wrong_method, 405)
    assert seen == []


# --- the KServe runtime's ASGI Guard -------------------------------------------------------------


class _App:
    """A tiny ASGI app: answers 200 with the length of the body it read."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        if scope["type"] == "http" and scope["method"] == "POST":
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
        self.calls.append((scope.get("path", ""), len(body)))
        reply = json.dumps({"read": len(body)}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})


def _guarded(tmp_path: Path, keys: bool = True) -> tuple[_App, httpx.AsyncClient]:
    app = _App()
    key_file = _key_file(tmp_path / "inference_key.json", "k")
    guard = Guard(app, keys=Keys(key_file) if keys else None, max_body=LIMIT)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://t")
    return app, client


def _oip_error(resp: httpx.Response, code: int) -> str:
    assert resp.status_code == code, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert set(body) == {"error"} and isinstance(body["error"], str)
    return body["error"]


INFER = "/v2/models/digits/infer"


def test_the_guard_wants_the_token_except_on_health_routes(tmp_path: Path) -> None:
    app, client = _guarded(tmp_path)

    async def calls() -> list[httpx.Response]:
        async with client:
            out = []
            for header in WRONG_TOKENS:
                for method, path in (("POST", INFER), ("GET", "/v2/models/digits"), ("GET", "/metrics")):  # fmt: skip
                    out.append(await client.request(method, path, headers=_auth(header)))
            for path in ("/v2/health/live", "/v2/health/ready"):
                out.append(await client.get(path))
            out.append(await client.post(INFER, content=b"{}", headers=_auth("Bearer k")))
            return out

    *refused, live, ready, passed = asyncio.run(calls())
    for resp in refused:
        assert "inference token" in _oip_error(resp, 401)
        assert resp.headers["www-authenticate"] == 'Bearer realm="pipeline"'
    assert [live.status_code, ready.status_code, passed.status_code] == [200, 200, 200]
    assert app.calls == [("/v2/health/live", 0), ("/v2/health/ready", 0), (INFER, 2)]


def test_the_guard_without_keys_asks_for_no_token(tmp_path: Path) -> None:
    app, client = _guarded(tmp_path, keys=False)

    async def call() -> httpx.Response:
        async with client:
            return await client.post(INFER, content=b"{}")

    assert asyncio.run(call()).status_code == 200
    assert app.calls == [(INFER, 2)]


def test_the_guard_refuses_a_chunked_body_mid_stream(tmp_path: Path) -> None:
    app, client = _guarded(tmp_path)
    sent = 0

    async def chunks(n: int) -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(n):
            sent += 1
            yield b"x" * 400

    async def call(n: int) -> httpx.Response:
        async with client:
            return await client.post(INFER, content=chunks(n), headers=_auth("Bearer k"))

    resp = asyncio.run(call(10))
    assert "max_request_size" in _oip_error(resp, 413)
    assert resp.headers["connection"] == "close"
    assert sent == 3  # refused at 1,200 bytes: the other 7 chunks were never read
    assert app.calls == []
    # Under the limit, the app gets the whole body, replayed.
    app, client = _guarded(tmp_path)
    assert asyncio.run(call(2)).json() == {"read": 800}
    assert app.calls == [(INFER, 800)]


def test_the_guard_refuses_a_declared_length_before_reading_anything(tmp_path: Path) -> None:
    app = _App()
    guard = Guard(app, keys=Keys(_key_file(tmp_path / "k.json", "k")), max_body=LIMIT)
    received: list[Any] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        received.append(1)
        return {"type": "http.request", "body": b"x" * 10**9, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def call(length: str) -> None:
        headers = [(b"authorization", b"Bearer k"), (b"content-length", length.encode())]
        scope = {"type": "http", "method": "POST", "path": INFER, "headers": headers}
        await guard(scope, receive, send)

    for length, code, fragment in ((str(10**9), 413, "max_request_size"), ("many", 400, "not a number")):  # fmt: skip
        sent.clear()
        asyncio.run(call(length))
        start, body = sent
        assert start["status"] == code
        headers = dict(start["headers"])
        assert headers[b"content-type"] == b"application/json"
        assert (headers.get(b"connection") == b"close") == (code == 413)
        message = json.loads(body["body"])
        assert set(message) == {"error"} and fragment in message["error"]
    assert received == [] and app.calls == []  # neither the body nor the app was touched


def test_the_guard_answers_unknown_routes_and_methods_in_json(tmp_path: Path) -> None:
    app, client = _guarded(tmp_path)

    async def calls() -> list[httpx.Response]:
        auth = _auth("Bearer k")
        async with client:
            return [
                await client.post("/openapi.json", headers=auth),
                await client.get("/v1/models", headers=auth),
                await client.get(INFER, headers=auth),
                await client.post("/v2/health/live"),
            ]

    missing, v1, wrong_method, post_health = asyncio.run(calls())
    assert "/openapi.json" in _oip_error(missing, 404)
    _oip_error(v1, 404)
    assert "GET is not allowed" in _oip_error(wrong_method, 405)
    _oip_error(post_health, 405)
    assert app.calls == []


@pytest.mark.parametrize(
    ("method", "header", "passes"),
    [
        ("/inference.GRPCInferenceService/ModelInfer", b"Bearer k", True),
        ("/inference.GRPCInferenceService/ModelInfer", "Bearer k", True),
        ("/inference.GRPCInferenceService/ModelInfer", b"Bearer wrong", False),
        ("/inference.GRPCInferenceService/ModelInfer", None, False),
        ("/inference.GRPCInferenceService/ServerLive", None, True),
    ],
)
def test_the_grpc_interceptor_uses_the_same_keys(
    tmp_path: Path, method: str, header: bytes | str | None, passes: bool
) -> None:
    interceptor = TokenInterceptor(Keys(_key_file(tmp_path / "k.json", "k")))
    metadata = [] if header is None else [("authorization", header)]
    details = SimpleNamespace(method=method, invocation_metadata=metadata)
    handler = object()

    async def continuation(_: Any) -> object:
        return handler

    got = asyncio.run(interceptor.intercept_service(continuation, details))
    assert (got is handler) == passes
