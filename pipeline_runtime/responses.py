"""TorchServe's limit on what a worker hands back: each answer within max_response_size.

A worker's answers travel to TorchServe's frontend in one message, and an answer over
`max_response_size` is a `TooLongFrameException` there (the frontend reads each answer's
length and checks it alone): the frontend drops the worker, starts another, and the
request (and every request batched with it) is answered 503 "workers kept dying". An
answer that can never fit (a Mask R-CNN's masks as JSON: 30 MB for one 128x128 image) did
that to every worker in a loop, while serve said the server was up. The handler now
measures its answers first (`fit`): one too large is its own request's 500, saying the
size and the way out, and the worker and the requests batched with it go on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Set by `pipeline serve` (torchserve/launch.py) to the max_response_size it configured.
MAX_RESPONSE_ENV = "PIPELINE_MAX_RESPONSE_SIZE"
# What serve and `deploy kserve`'s config.properties give TorchServe unless told otherwise
# (TorchServe's own default is 6,553,500): the handler's limit where no serve set one.
DEFAULT_MAX_RESPONSE = 16 * 1024 * 1024


@dataclass(frozen=True)
class Refusal:
    index: int  # the answer's place in the batch
    status: int
    message: str


def limit() -> int:
    """The frontend's max_response_size in bytes, as serve configured it (else the default
    serve and `deploy kserve` write)."""
    value = os.environ.get(MAX_RESPONSE_ENV, "")
    ok = value.isascii() and value.isdigit() and int(value) > 0
    return int(value) if ok else DEFAULT_MAX_RESPONSE


def fit(sizes: list[int], most: int) -> list[Refusal]:
    """The answers (by their encoded `sizes`) to replace by an error: each over `most`."""
    return [
        Refusal(
            i,
            500,
            f"The answer is {size} bytes, over this server's response limit of {most} bytes "
            "(TorchServe's max_response_size): send fewer samples per request, or restart "
            f"`pipeline serve` with --max-response-size {_above(size)} or more.",
        )
        for i, size in enumerate(sizes)
        if size > most
    ]


def _above(size: int) -> int:
    """`size` rounded up to a whole MiB, for a flag a user copies."""
    mib = 1024 * 1024
    return -(-size // mib) * mib
