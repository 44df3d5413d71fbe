import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.fileio import (
    atomic_write,
    sha256_file,
    staging_dir,
    sweep_abandoned,
    write_json,
)


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


def test_sweep_removes_only_what_a_dead_process_on_this_host_left(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    host, pid = socket.gethostname(), dead.stdout.strip()
    space = os.stat("/proc/self/ns/pid").st_ino
    left = tmp_path / f".export.staging-~{pid}.{space}@{host}~abcd1234"
    elsewhere = tmp_path / f".export.staging-~{pid}.{space}@not-{host}~abcd1234"
    # Another container on this host and folder: its pids are not ours to judge.
    other_space = tmp_path / f".export.staging-~{pid}.{space + 1}@{host}~abcd1234"
    plain = tmp_path / ".export.staging-abcd1234"  # no owner in its name: never ours to judge
    for folder in (left, elsewhere, other_space, plain):
        (folder / "sub").mkdir(parents=True)
    live = staging_dir(".export.staging-", tmp_path)
    assert f"~{os.getpid()}.{space}@{host}~" in live.name
    assert sweep_abandoned(tmp_path) == [left]
    assert sorted(tmp_path.iterdir()) == sorted([elsewhere, other_space, plain, live])
    assert sweep_abandoned(tmp_path / "missing") == []
