"""What the gateway forwards: a client's body, and the media type TorchServe is told.

TorchServe 0.12's Java frontend decodes two media types itself, before any
handler code runs: `application/x-www-form-urlencoded` (what curl sends with
`--data-binary` unless told otherwise) and `multipart/form-data`. Measured
here, through the README's own curl line: a digits PNG holding '%' before
non-hex bytes got `500 ErrorDataDecoderException`; a PNG without one reached
the handler as garbled form fields (415); a JSON body without '=' reached it as
nothing at all ("Empty request body", 400); and malformed multipart bodies
(base64 parts, unknown charsets, a part without a name, an empty boundary)
got 500s. `upstream_body` makes sure TorchServe never decodes a form: it
tells TorchServe what the body is, recognised by its content
(`pipeline_runtime.request.sniff`, the test the handler decodes by: PNG, JPEG,
.npy, .npz, JSON); a body it does not recognise keeps a declared JSON, image or
octet-stream type and otherwise goes as application/octet-stream (the handler
then answers 415); a multipart form is replaced by its file.
"""

from __future__ import annotations

from email import policy
from email.parser import BytesParser

from pipeline_runtime.request import sniff

# The media types TorchServe hands the handler as the raw body (JSON parsed).
FORWARDED_TYPES = ("application/json", "application/octet-stream", "image/png", "image/jpeg")
# What a body of each kind `sniff` recognises is forwarded as; .npy and .npz go as
# application/octet-stream.
SNIFFED_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "json": "application/json"}


class BodyError(ValueError):
    """A body the gateway cannot forward (a multipart form without one file); a 400."""


def upstream_body(content_type: str | None, body: bytes) -> tuple[bytes, str]:
    """(body, media type) to forward to TorchServe for a client's body and Content-Type.

    A multipart form is replaced by its file; one in which no part is found (no
    boundary, or not the declared one) is taken for the raw body it probably is.
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "multipart/form-data":
        body, media = form_file(content_type or "", body)
    kind = sniff(body)
    if kind is not None:  # the content wins: the handler decodes by it too
        return body, SNIFFED_TYPES.get(kind, "application/octet-stream")
    return body, media if media in FORWARDED_TYPES else "application/octet-stream"


def form_file(content_type: str, body: bytes) -> tuple[bytes, str]:
    """The file a form carries (`curl -F data=@digit.png`) and its declared media type: the
    part named "data" or "body" (TorchServe's names), or the only part."""
    try:
        head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
        message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
        parts = message.get_payload() if message.is_multipart() else []
        if not parts:
            return body, ""
        names = [p.get_param("name", header="content-disposition") for p in parts]
        chosen = [p for p, n in zip(parts, names, strict=True) if n in ("data", "body")]
        part = (chosen or (parts if len(parts) == 1 else [None]))[0]
        if part is not None:
            declared = part.get_content_type() if part.get("Content-Type") else ""
            return part.get_payload(decode=True) or b"", declared
    except Exception as err:  # noqa: BLE001 - the email parser raises many types on odd headers
        raise BodyError(f"The multipart form cannot be read: {err}") from None
    raise BodyError(
        f"The multipart form holds {len(parts)} parts named {names}; send one part named "
        "'data' (curl -F data=@digit.png), or better the raw body (curl --data-binary @digit.png)."
    )
