"""Counting manifest reads: within one command each export's manifest is read once (the
layers hand each other the opened export, not its folder)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline_runtime.manifest import Manifest


@contextlib.contextmanager
def counted() -> Iterator[collections.Counter[Path]]:
    """Every `Manifest.read` in this process while the block runs, by resolved folder
    (every reader goes through it: core.manifest.read_manifest and open_export too)."""
    reads: collections.Counter[Path] = collections.Counter()
    read = Manifest.read.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Manifest], export_dir: Path) -> Manifest:
        reads[Path(export_dir).resolve()] += 1
        return read(cls, export_dir)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Manifest, "read", classmethod(counting))
        yield reads
