"""What a request may be: the size limits, the input contract, and the error that refuses one.

Shared by the decoders (`pipeline_runtime.codec` for JSON and the v2
protocol, `pipeline_runtime.binary` for NumPy and image bodies); no torch.
"""

from __future__ import annotations

from typing import Any

from pipeline_runtime.manifest import TensorRecord

MAX_ELEMENTS = 50_000_000  # refuse absurd shapes before allocating them
MAX_JSON_DEPTH = 64  # deeper nesting than any tensor needs is an attack
MAX_IMAGE_PIXELS = 4096 * 4096


# An input's name, shape (a str is a named dynamic axis) and dtype: the manifest's own record.
InputSpec = TensorRecord


class RequestError(Exception):
    """A request that cannot be served; becomes a 4xx JSON answer."""

    def __init__(self, message: str, status: int = 400, expected: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.expected = expected

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.status, "error": str(self)}
        if self.expected is not None:
            body["expected"] = self.expected
        return body
