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

__all__ = ["atomic_path", "atomic_write", "sha256_file", "write_json"]


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it over `target` on success.

    On any exception the temporary file is removed and `target` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates 0600; give the result the mode an ordinary write would (umask applied).
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o666 & ~umask)
    try:
        yield tmp
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(target: Path, writer: Callable[[Path], None]) -> Path:
    """Call `writer(tmp_path)` and atomically move the result to `target`."""
    with atomic_path(target) as tmp:
        writer(tmp)
    return Path(target)


def write_json(target: Path, data: Any) -> Path:
    """Write `data` as indented, key-sorted JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return atomic_write(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))
