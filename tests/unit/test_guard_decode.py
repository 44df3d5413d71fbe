"""Request bodies sent with a Content-Encoding: inflated under the body limit, or refused."""

from __future__ import annotations

import gzip
import zlib

import pytest

from pipeline.serving.guard import BodyLimit, Refusal, decode_body, unsupported_encoding

BODY = b'{"inputs": [1, 2, 3]}' * 50


def _gz(data: bytes) -> bytes:
    # mtime 0: the same bytes in every process (xdist's workers must collect the same ids)
    return gzip.compress(data, mtime=0)


LIMIT = BodyLimit(len(BODY))


@pytest.mark.parametrize(
    ("encoded", "encoding"),
    [
        (_gz(BODY), "gzip"),
        (_gz(BODY), "X-GZIP"),
        (zlib.compress(BODY), "deflate"),  # HTTP's deflate: zlib's format
        (zlib.compress(BODY)[2:-4], "deflate"),  # raw deflate, as some clients send it
        (BODY, "identity"),
        (BODY, None),
    ],
    ids=["gzip", "x-gzip", "deflate", "raw-deflate", "identity", "none"],
)
def test_a_body_is_inflated_to_what_was_sent(encoded: bytes, encoding: str | None) -> None:
    assert decode_body(encoded, encoding, LIMIT) == BODY


@pytest.mark.parametrize(
    ("encoded", "encoding", "status", "said"),
    [
        (BODY, "gzip", 400, "does not decode as gzip"),
        (_gz(BODY)[:-12], "gzip", 400, "ends early"),
        (_gz(BODY + b" "), "gzip", 413, "over the server's limit"),
        (_gz(b"\0" * (100 * len(BODY))), "gzip", 413, "over the server's limit"),
        (BODY, "br", 415, "'br' is not supported"),
    ],
    ids=["plain-labelled-gzip", "truncated", "one-byte-over", "bomb", "brotli"],
)
def test_what_does_not_decode_or_decodes_too_big_is_refused(
    encoded: bytes, encoding: str, status: int, said: str
) -> None:
    refusal = decode_body(encoded, encoding, LIMIT)
    assert isinstance(refusal, Refusal) and refusal.status == status and said in refusal.message


def test_only_gzip_deflate_and_identity_are_taken() -> None:
    assert [unsupported_encoding(e) for e in (None, "", "identity", "gzip", "deflate")] == [
        None
    ] * 5
    assert unsupported_encoding("zstd").status == 415
