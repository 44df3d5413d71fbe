"""The KServe runtime's key files: an inference token that outlives restarts, a metrics key.

`pipeline serve --runtime kserve` keeps `<run_dir>/inference_key.json` from one start
to the next, so clients holding the token keep working after a restart (issue 28,
point 4); `--rotate-token` writes a new one on purpose. A file is reused only when
it is one this runtime would have written: a regular file (not a link), owned by
this user, mode 0600, JSON `{"<kind>": {"key": "<43+ URL-safe characters>"}}`.
Anything else (missing, unreadable, another mode, bad JSON, a short key such as
TorchServe's 8-character one left in a shared run folder) is replaced, and the log
says why: a file someone could have read or written is not a secret any more.

`metrics_key.json` (`{"metrics": {"key": ...}}`) follows the same rules; the launcher
writes it only when the runtime listens off loopback, where /metrics needs it.

Both are written with `pipeline.core.fileio.write_secret` (0600 from creation to rename).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.core import fileio
from pipeline.runtimes.kserve.constants import METRICS_KEY_FILE
from pipeline.serving.server import ServeError

log = logging.getLogger(__name__)

__all__ = [
    "INFERENCE",
    "METRICS",
    "METRICS_KEY_FILE",
    "KeyFileError",
    "KeyState",
    "ensure_key",
    "new_key",
    "read_key",
]

INFERENCE = "inference"
METRICS = "metrics"
KEY_BYTES = 32  # 256 bits, as secrets' documentation advises for tokens
# secrets.token_urlsafe(32) is 43 characters. Shorter keys are not ours (TorchServe's are
# 8 characters, 48 bits): reusing one would weaken the runtime's token.
_KEY = re.compile(r"[A-Za-z0-9_\-]{43,}")
_MAX_FILE = 64 * 1024  # a key file is ~60 bytes; read no more than this of one


class KeyFileError(Exception):
    """Why an existing key file cannot be reused (the message completes "<path> ...")."""


@dataclass(frozen=True)
class KeyState:
    """What a start did with one key file."""

    path: Path
    # kept: reused as it was; new: there was none; replaced: the old one was not fit
    # (see `reason`); rotated: --rotate-token asked for a new one.
    action: Literal["kept", "new", "replaced", "rotated"]
    reason: str = ""

    @property
    def changed(self) -> bool:
        """Whether clients holding the previous key must read the file again."""
        return self.action in ("replaced", "rotated")


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def read_key(path: Path, kind: str = INFERENCE) -> str:
    """The key in `path` if it is fit for reuse (see the module doc), else KeyFileError."""
    try:
        # O_NOFOLLOW: a link planted at the path is refused, not followed; the checks below
        # are on the file descriptor, so what is checked is what is read.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise KeyFileError("is missing") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise KeyFileError("is a symbolic link") from None
        raise KeyFileError(f"cannot be read ({err.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError("is not a regular file")
        if st.st_uid != os.geteuid():
            raise KeyFileError(f"is owned by uid {st.st_uid}, not this user ({os.geteuid()})")
        mode = stat.S_IMODE(st.st_mode)
        if mode != 0o600:
            raise KeyFileError(f"has mode {mode:04o}, not 0600 (owner-only)")
        try:
            raw = os.read(fd, _MAX_FILE)
        except OSError as err:
            raise KeyFileError(f"cannot be read ({err.strerror})") from None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise KeyFileError(f"is not JSON ({err})") from None
    section = data.get(kind) if isinstance(data, dict) else None
    key = section.get("key") if isinstance(section, dict) else None
    if not isinstance(key, str):
        raise KeyFileError(f'holds no {{"{kind}": {{"key": ...}}}}')
    if not _KEY.fullmatch(key):
        raise KeyFileError(
            "holds a key this runtime did not write (43 or more URL-safe characters)"
        )
    return key


def ensure_key(path: Path, kind: str = INFERENCE, rotate: bool = False) -> KeyState:
    """Reuse the key in `path` when it is fit (see the module doc); write a new one when it
    is not, or when `rotate`. Every outcome is logged; a key never is."""
    path = Path(path)
    reason = ""
    if not rotate:
        try:
            read_key(path, kind)
        except KeyFileError as err:
            reason = str(err)
        else:
            log.info("%s: kept the %s token of the previous start", path, kind)
            return KeyState(path, "kept")
    try:
        fileio.write_secret(path, {kind: {"key": new_key()}})
    except OSError as err:
        raise ServeError(f"Cannot write the {kind} token to {path}: {err}.") from None
    if rotate:
        log.warning(
            "%s: wrote a new %s token (--rotate-token); clients must read it again", path, kind
        )
        return KeyState(path, "rotated")
    if reason == "is missing":
        log.info("%s: wrote a new %s token (there was none)", path, kind)
        return KeyState(path, "new", reason)
    log.warning(
        "%s %s: replaced it with a new %s token; clients must read it again", path, reason, kind
    )
    return KeyState(path, "replaced", reason)
