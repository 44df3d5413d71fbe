"""One guard for every runtime's front door: the inference token, the body limit, JSON errors.

The decisions live here; each runtime keeps a thin adapter that asks them and
writes the answer in its own server's terms (the TorchServe gateway's aiohttp
middleware and handler, the KServe runtime's ASGI `Guard` and gRPC interceptor):

* the token: `Authorization: Bearer <inference key>`, the key re-read from the
  run's key file when it changes and compared in constant time; anything else
  is a 401 with `WWW-Authenticate` (RFC 7235 §3.1 requires the header);
* the body limit: a declared Content-Length over the limit is refused before
  any of the body is read, and a streamed (chunked) body as soon as what has
  arrived passes it, so a client cannot make the server buffer more than that;
* the error body: JSON in the shape the runtime's clients already parse, the
  Open Inference Protocol's `{"error"}` (`oip_shape`) or a runtime's own (the
  TorchServe gateway's `{"code", "type", "message"}`), via `Refusal.json(shape)`.

Nothing here imports a web framework: an adapter hands in a header's value or
the body's chunks and gets a `Refusal` (or None, or the body) back.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import zlib
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("pipeline.serving.guard")

WWW_AUTHENTICATE = 'Bearer realm="pipeline"'
TOKEN_REQUIRED = (
    "A valid inference token is required: send 'Authorization: Bearer <key>' with the "
    "'inference' key from the server's inference_key.json."
)


class Keys:
    """A run's key of one kind (`{"inference": {"key": ...}}`), re-read whenever the file changes.

    TorchServe's `key_file.json` and the KServe runtime's `inference_key.json` share the shape;
    the KServe runtime's `metrics_key.json` holds `{"metrics": {"key": ...}}` (kind "metrics").
    """

    def __init__(self, path: Path, kind: str = "inference") -> None:
        self.path = Path(path)
        self.kind = kind
        self._stamp: tuple[int, int] | None = None
        self._key = b""

    def current(self) -> bytes:
        try:
            st = self.path.stat()
        except OSError:
            return self._key
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._key = json.loads(self.path.read_text())[self.kind]["key"].encode()
                self._stamp = stamp
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                log.warning("cannot read %s (%s); keeping the previous key", self.path, err)
        return self._key

    def accepts(self, header: str | None) -> bool:
        """Whether an `Authorization` header's value carries the key (`Bearer`, any case)."""
        if not header:
            return False
        scheme, _, token = header.partition(" ")
        key = self.current()
        # compare_digest: the time taken does not tell an attacker how much matched.
        return (
            scheme.lower() == "bearer"
            and bool(key)
            and hmac.compare_digest(token.strip().encode(), key)
        )


@dataclass(frozen=True)
class Refusal:
    """An answer the guard gives instead of the application's."""

    status: int
    kind: str  # TorchServe's "type" field: "Unauthorized", "RequestEntityTooLarge", ...
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self, shape: Shape) -> bytes:
        return json.dumps(shape(self)).encode()


Shape = Callable[[Refusal], dict[str, Any]]


def oip_shape(refusal: Refusal) -> dict[str, Any]:
    """The Open Inference Protocol's error shape."""
    return {"error": refusal.message}


def check_token(keys: Keys | None, header: str | None) -> Refusal | None:
    """None when the request may pass (`keys` None: no token is asked for), else the 401."""
    if keys is None or keys.accepts(header):
        return None
    return Refusal(401, "Unauthorized", TOKEN_REQUIRED, {"WWW-Authenticate": WWW_AUTHENTICATE})


# How long a whole request body may take to arrive before the answer is a 408. A body
# that never completes (a Content-Length never reached, the connection held open) would
# otherwise hold its request's slot until the client leaves: on the Ray ingress, about
# 1,100 such connections (past its max_ongoing_requests) blocked every other client.
BODY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes a request body may have (the runtime's `max_request_size`), and how
    long it may take to arrive (`timeout_s`; None: no deadline here, for a runtime whose
    server does not keep a request slot per held connection)."""

    limit: int
    timeout_s: float | None = None

    def too_slow(self) -> Refusal:
        return Refusal(
            408,
            "RequestTimeout",
            f"The request body did not arrive in full within {self.timeout_s:g} s (a "
            "Content-Length longer than the body sent?); send the whole body again.",
            # The rest of that body may still come: the connection is not reused for it.
            {"Connection": "close"},
        )

    def too_big(self, size: int) -> Refusal:
        return Refusal(
            413,
            "RequestEntityTooLarge",
            f"The request body ({size} bytes or more) is over the server's limit of "
            f"{self.limit} bytes (max_request_size); split it or raise --max-request-size.",
        )

    def check_declared(self, content_length: str | int | None) -> Refusal | None:
        """Decided from the header alone, before any of the body is read."""
        if content_length is None:
            return None
        try:
            size = int(content_length)
        except ValueError:
            return Refusal(400, "BadRequest", "Content-Length is not a number.")
        return self.too_big(size) if size > self.limit else None

    async def read(self, chunks: AsyncIterable[bytes]) -> bytes | Refusal:
        """The whole body, or the 413 as soon as what has arrived passes the limit
        (nothing after that chunk is read), or the 408 once `timeout_s` has passed
        before the body ended."""
        if self.timeout_s is None:
            return await self._read(chunks)
        try:
            # The whole body's deadline, not each chunk's: a byte a second would keep a
            # per-chunk timer from ever firing.
            return await asyncio.wait_for(self._read(chunks), self.timeout_s)
        except TimeoutError:
            return self.too_slow()

    async def _read(self, chunks: AsyncIterable[bytes]) -> bytes | Refusal:
        body = bytearray()
        async for chunk in chunks:
            body += chunk
            if len(body) > self.limit:
                return self.too_big(len(body))
        return bytes(body)


# Content-Encoding of request bodies (Triton's client sends gzip or deflate when asked).
DECODED = ("gzip", "x-gzip", "deflate")


def unsupported_encoding(encoding: str | None) -> Refusal | None:
    """A 415 for a Content-Encoding the runtimes do not decode; None for gzip, deflate,
    identity or none."""
    name = (encoding or "identity").strip().lower()
    if name in (*DECODED, "identity", ""):
        return None
    return Refusal(
        415,
        "UnsupportedMediaType",
        f"Content-Encoding {name!r} is not supported; send the body as it is, or gzip or "
        "deflate it.",
    )


def decode_body(body: bytes, encoding: str | None, limit: BodyLimit) -> bytes | Refusal:
    """`body` decoded from its Content-Encoding, never more than the limit of output: a
    body that would decode past it (a decompression bomb) gets the 413 from the first
    `limit + 1` bytes, with nothing more held. A body that does not decode gets a 400."""
    refusal = unsupported_encoding(encoding)
    if refusal is not None:
        return refusal
    name = (encoding or "identity").strip().lower()
    if name in ("identity", ""):
        return body
    # gzip has its own header; HTTP's "deflate" is zlib's format (RFC 9110), which some
    # clients send raw: both are tried.
    wbits = (16 + zlib.MAX_WBITS,) if "gzip" in name else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    problem = ""
    for bits in wbits:
        inflate = zlib.decompressobj(bits)
        try:
            out = inflate.decompress(body, limit.limit + 1)
        except zlib.error as err:
            problem = str(err)
            continue
        if len(out) > limit.limit or inflate.unconsumed_tail:
            return limit.too_big(limit.limit + 1)
        if not inflate.eof:
            problem = "the compressed data ends early"
            continue
        return out
    return Refusal(400, "BadRequest", f"The body does not decode as {name}: {problem}.")
