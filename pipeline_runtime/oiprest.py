"""The Open Inference Protocol's REST infer body, read: JSON, or JSON then binary tensors
when `Inference-Header-Content-Length` says where the JSON ends (the binary tensor
extension's rule, whatever the Content-Type says). One reader for every runtime that
answers `/v2/models/<name>/infer` itself: the KServe runtime's fast path and the Ray
ingress (which said "invalid literal for int()" of a bad length header).
"""

from __future__ import annotations

import re

import orjson

from pipeline_runtime import oip


class BodyError(ValueError):
    """The body is not a request this protocol can read: the client's error (400)."""


def parse(body: bytes, length: bytes | str | None) -> oip.Request:
    """A REST infer body → typed request: binary exactly when the length header
    (`Inference-Header-Content-Length`, its value or None) is there. BodyError (a 400)."""
    split = len(body)
    if length is not None:
        try:
            split = int(length)
        except ValueError:
            raise BodyError(f"{oip.HEADER_LENGTH} is not a number: {length[:40]!r}.") from None
        if not 0 < split <= len(body):
            raise BodyError(f"{oip.HEADER_LENGTH} is {split}; the body has {len(body)} bytes.")
    if not body:
        raise BodyError("The request has no body; send an Open Inference Protocol request.")
    try:
        parsed = orjson.loads(body[:split])
    except orjson.JSONDecodeError as err:
        if length is not None and split < len(body) and _is_json(body):
            raise BodyError(_stale_length(split, len(body))) from None
        raise BodyError(_not_json(body[:split], err, length is not None)) from None
    try:
        return oip.Request.from_json(parsed, body[split:])
    except (oip.OipError, RecursionError) as err:
        raise BodyError(f"Malformed request: {err}") from None


def _not_json(text: bytes, err: orjson.JSONDecodeError, binary: bool) -> str:
    """Why `text` is not the request's JSON, as a client can act on it: a NaN or Infinity
    literal (or 1e400) was "the body is not JSON (binary tensors need the ... header):
    number is infinity when parsed as double", and random bytes got the parser's "str is
    not valid UTF-8: surrogates not allowed" (a user's trial)."""
    if text.lstrip()[:1] in (b"{", b"["):  # JSON, broken: no binary hint
        said = str(err)
        if "infinity" in said or _NON_FINITE.search(text):
            return (
                "The body is not JSON: it holds NaN, Infinity or a number past float64's "
                "range, which JSON cannot carry; send finite values"
            )
        return f"The body is not JSON: {said}"
    if binary:
        return f"The body is not JSON: {err}"
    return (
        f"The body is not JSON (binary tensors need the {oip.HEADER_LENGTH} header): it "
        f"starts with {text[:8]!r}; the Open Inference Protocol over REST takes a JSON request"
    )


_NON_FINITE = re.compile(rb"[:\[,]\s*-?(NaN|Infinity)\b")


def _is_json(body: bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def _stale_length(split: int, size: int) -> str:
    """The 400 for a JSON body sent with a length header left over from a binary request.

    Issue 28's intermittent 400 ("unexpected end of data ... (char 171)"): Triton's
    HTTP client (and kserve's InferenceRESTClient, for a binary InferRequest) writes
    Inference-Header-Content-Length into the `headers` dict the caller passes and never takes it out, so a JSON request made after a binary one
    with the same dict carries the binary request's length (171 bytes for digits).
    The extension says the header means binary, so this stays a 400; the message
    names the cause, which the bare JSON error did not."""
    return (
        f"{oip.HEADER_LENGTH} says the JSON part is {split} bytes, but the whole "
        f"{size}-byte body is one JSON document: the header looks left over from an "
        "earlier binary request. Triton's HTTP client (tritonclient) and kserve's "
        "InferenceRESTClient add it to the headers dict you pass and keep it there: pass "
        "a fresh dict to each call, or drop the header from a JSON request."
    )
