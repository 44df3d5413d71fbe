"""Artifact integrity: the sha256 every loader checks against the manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks so large artifacts do not fill memory."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class IntegrityError(RuntimeError):
    """An artifact whose bytes are not the ones export recorded."""


def check_sha256(path: Path, expected: str) -> Path:
    """`path`, after checking its sha256; `IntegrityError` (saying what to do) if it differs."""
    actual = sha256_file(path)
    if actual != expected:
        raise IntegrityError(
            f"Artifact {path} was modified after export: its sha256 is {actual}, the manifest "
            f"records {expected}. Refusing to use it; re-run `pipeline export` to regenerate it."
        )
    return Path(path)
