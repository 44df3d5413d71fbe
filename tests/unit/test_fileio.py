import json
from pathlib import Path

import pytest

from pipeline.core.fileio import atomic_write, sha256_file, write_json


def test_atomic_write_keeps_old_file_when_writer_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})

    def broken(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, broken)
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp left behind


def test_sha256_matches_hashlib(tmp_path: Path) -> None:
    import hashlib

    p = tmp_path / "f"
    p.write_bytes(b"x" * 3_000_000)
    assert sha256_file(p) == hashlib.sha256(b"x" * 3_000_000).hexdigest()


def test_atomic_write_gives_ordinary_permissions(tmp_path: Path) -> None:
    import os

    umask = os.umask(0o022)
    try:
        target = write_json(tmp_path / "m.json", {})
    finally:
        os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o644
