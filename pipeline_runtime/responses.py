"""TorchServe's limit on what a worker hands back: a batch's answers within max_response_size.

A worker's answers to one batch travel to TorchServe's frontend as one message, and a
message over `max_response_size` is a `TooLongFrameException` there: the frontend drops
the worker, starts another, and the request (and every request batched with it) is
answered 503 "workers kept dying". An answer that can never fit (a Mask R-CNN's masks
as JSON: 30 MB for one 128×128 image) did that to every worker in a loop, while serve
said the server was up. The handler now measures its answers first (`fit`): one that
cannot fit alone is its request's 500, saying the size and the way out; answers that fit
alone but not together are sent again by their clients (503).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Set by `pipeline serve` (torchserve/launch.py) to the max_response_size it configured.
MAX_RESPONSE_ENV = "PIPELINE_MAX_RESPONSE_SIZE"
# The message's own framing around the answers: request ids, headers, content types.
HEADROOM = 64 * 1024


@dataclass(frozen=True)
class Refusal:
    index: int  # the answer's place in the batch
    status: int
    message: str


def limit() -> int | None:
    """The frontend's max_response_size in bytes, as serve configured it (None: not said)."""
    value = os.environ.get(MAX_RESPONSE_ENV, "")
    return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None


def fit(sizes: list[int], most: int | None) -> list[Refusal]:
    """The answers (by their encoded `sizes`) to replace by an error so that the rest fit
    in one message of at most `most` bytes: each too large alone, then the largest of the
    others until they fit."""
    if most is None:
        return []
    budget = max(1, most - HEADROOM)
    refused = [
        Refusal(
            i,
            500,
            f"The answer is {size} bytes, over this server's response limit of {most} bytes "
            "(TorchServe's max_response_size): send fewer samples per request, or restart "
            f"`pipeline serve` with --max-response-size {_above(size + HEADROOM)} or more.",
        )
        for i, size in enumerate(sizes)
        if size > budget
    ]
    gone = {r.index for r in refused}
    kept = sorted((i for i in range(len(sizes)) if i not in gone), key=lambda i: -sizes[i])
    total = sum(sizes[i] for i in kept)
    for i in kept:
        if total <= budget:
            break
        total -= sizes[i]
        refused.append(
            Refusal(
                i,
                503,
                f"The answers batched with this one came to more than this server's response "
                f"limit of {most} bytes together; send it again (alone, its {sizes[i]} bytes fit).",
            )
        )
    return refused


def _above(size: int) -> int:
    """`size` rounded up to a whole MiB, for a flag a user copies."""
    mib = 1024 * 1024
    return -(-size // mib) * mib
