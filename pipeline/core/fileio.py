"""Hashing and atomic writes shared by every stage.

A stage's output is either complete or absent: each file is written to a
temporary name in the same directory, flushed to disk, then renamed over the
target (rename within one filesystem is atomic on POSIX).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline_runtime.files import sha256_file

__all__ = ["atomic_path", "atomic_write", "sha256_file", "write_json", "write_secret"]


@contextmanager
def atomic_path(target: Path, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it over `target` on success.

    On any exception the temporary file is removed and `target` is untouched.
    `mode`: the file's permissions (default: an ordinary write's, the umask applied).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates 0600 (O_EXCL: never through a file or link someone left there); give
    # the result the mode asked for, or the one an ordinary write would (umask applied).
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    tmp.chmod(mode)
    try:
        yield tmp
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(target: Path, writer: Callable[[Path], None], mode: int | None = None) -> Path:
    """Call `writer(tmp_path)` and atomically move the result to `target`."""
    with atomic_path(target, mode) as tmp:
        writer(tmp)
    return Path(target)


def write_json(target: Path, data: Any) -> Path:
    """Write `data` as indented, key-sorted JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return atomic_write(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_secret(target: Path, data: Any) -> Path:
    """Write `data` as JSON readable by the owner only (0600 from creation to rename):
    token files."""
    text = json.dumps(data, indent=2) + "\n"
    return atomic_write(target, lambda tmp: tmp.write_text(text, encoding="utf-8"), mode=0o600)
