"""The shared guard (pipeline.serving.guard) and the gateway's use of it, in-process.

The TorchServe gateway is driven through aiohttp's TestClient/TestServer with a
stand-in upstream.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline.runtimes.torchserve.gateway import GatewayConfig, build_app
from pipeline.serving.guard import (
    WWW_AUTHENTICATE,
    BodyLimit,
    Keys,
    Refusal,
    check_token,
    oip_shape,
    torchserve_shape,
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
