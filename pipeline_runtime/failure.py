"""What a client is told when the model itself fails (a 500): the error, not its traceback.

A TorchScript failure's text is the interpreter's whole traceback (the model's source, its
file paths on the server, every frame of a traced module's recording) and a LibTorch error
carries "Exception raised from ... at /pytorch/...cpp" and its C++ frames. A client needs
the error's one line; the server's log keeps the rest (every caller logs the exception).
"""

from __future__ import annotations

import re

# The interpreter's first line: its last line is then the error itself ("RuntimeError: ...").
TORCHSCRIPT_HEAD = "The following operation failed in the TorchScript interpreter."
# Where a c10::Error's message ends and its C++ frames begin.
_CPP_FRAMES = re.compile(r"\n?Exception raised from .*", re.DOTALL)
_NAMED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")
MAX_CHARS = 400


def summary(err: BaseException) -> str:
    """`err` in one line a client may read: its type and message, without tracebacks, source
    lines or server paths, at most MAX_CHARS characters."""
    # A Ray task's failure wraps the replica's exception with the replica's traceback.
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        err = cause
    text = _CPP_FRAMES.sub("", str(err)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0] == TORCHSCRIPT_HEAD:
        lines = lines[-1:]  # "RuntimeError: shape '[3, 7]' is invalid for input of size 10"
    message = " ".join(lines) or "(no message)"
    if not _NAMED.match(message):
        message = f"{type(err).__name__}: {message}"
    if len(message) > MAX_CHARS:
        message = message[: MAX_CHARS - 1] + "…"
    return message
