"""A request body that never completes (Content-Length: 1000, 13 bytes sent, the connection
held) got no answer from the Ray ingress, which read it with no deadline: about 1,100 such
connections, past the ingress's max_ongoing_requests, blocked every other client (a
user's trial, 2026-11-29). The ingress now answers 408 with a JSON message once the
body's deadline (guard.BODY_TIMEOUT_S) has passed. In process: the ingress's own class,
a Starlette request and an ASGI receive that never sends the rest."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from pipeline.runtimes.ray import app
from pipeline.serving import guard

KEY = "k" * 32


class _Available:
    """Serve's status, which only a replica can read: every model up."""

    def __init__(self, deployments: dict[str, str]) -> None:
        self.down: dict[str, str] = {}


def _ingress(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, timeout_s: float) -> Any:
    monkeypatch.setattr(app, "Availability", _Available)
    token = tmp_path / "inference_key.json"
    token.write_text(json.dumps({"inference": {"key": KEY}}))
    config = {
        "models": [],
        "token_file": str(token),
        "max_request_size": 10_000,
        "body_timeout_s": timeout_s,
    }
    ingress = app.Ingress.func_or_class(config)
    ingress.models["m"] = {}  # the body is read before the model's settings are
    return ingress


def _held_request(sent: bytes, declared: int) -> Request:
    """POST /v2/models/m/infer whose body stops after `sent`, the connection held."""
    chunks = [{"type": "http.request", "body": sent, "more_body": True}]

    async def receive() -> dict[str, Any]:
        if chunks:
            return chunks.pop()
        await asyncio.sleep(3600)  # the rest never comes
        return {"type": "http.disconnect"}

    headers = [
        (b"authorization", f"Bearer {KEY}".encode()),
        (b"content-length", str(declared).encode()),
        (b"content-type", b"application/json"),
    ]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/m/infer",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }
    return Request(scope, receive)


def test_a_body_that_never_completes_is_answered_408_in_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ingress = _ingress(monkeypatch, tmp_path, timeout_s=0.3)
    began = time.monotonic()
    # The outer bound: without the deadline the ingress would wait for the body forever.
    answer = asyncio.run(
        asyncio.wait_for(ingress(_held_request(b'{"inputs": [', 1000)), timeout=10)
    )
    assert time.monotonic() - began < 5
    assert answer.status_code == 408
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.headers.get("connection") == "close"
    said = json.loads(answer.body)["error"]
    assert "did not arrive in full within 0.3 s" in said, said


def test_the_ingress_deadline_defaults_to_the_guards(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ingress = _ingress(monkeypatch, tmp_path, timeout_s=0.3)
    config = {"models": [], "token_file": str(tmp_path / "k"), "max_request_size": 10}
    ingress = app.Ingress.func_or_class(config)  # what serve writes: no body_timeout_s
    assert ingress.limit.timeout_s == guard.BODY_TIMEOUT_S > 0


def test_a_body_that_arrives_in_time_is_read_whole() -> None:
    async def chunks() -> Any:
        for part in (b"ab", b"cd"):
            await asyncio.sleep(0.01)
            yield part

    assert asyncio.run(guard.BodyLimit(100, 5.0).read(chunks())) == b"abcd"
