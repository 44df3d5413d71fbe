"""The gateway's token check and the serve command's exposure warning, without a server."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.serving.gateway import Keys
from pipeline.serving.torchserve import ServeConfig, exposure_warning


def _key_file(path: Path, key: str) -> Path:
    path.write_text(json.dumps({"inference": {"key": key}, "management": {"key": "m"}}))
    return path


def test_bearer_token_is_checked_exactly(tmp_path: Path) -> None:
    keys = Keys(_key_file(tmp_path / "key_file.json", "s3cret"))
    assert keys.accepts("Bearer s3cret")
    assert keys.accepts("bearer s3cret")  # the scheme is case-insensitive (RFC 7235)
    for header in (None, "", "Bearer", "Bearer s3cre", "Bearer s3crett", "Basic s3cret", "s3cret"):
        assert not keys.accepts(header), header


def test_a_rotated_key_is_picked_up(tmp_path: Path) -> None:
    path = _key_file(tmp_path / "key_file.json", "old")
    keys = Keys(path)
    assert keys.accepts("Bearer old")
    _key_file(path, "new-key")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert keys.accepts("Bearer new-key")
    assert not keys.accepts("Bearer old")


def test_no_key_file_accepts_nothing(tmp_path: Path) -> None:
    keys = Keys(tmp_path / "missing.json")
    assert not keys.accepts("Bearer ")
    assert not keys.accepts("Bearer anything")


def test_a_non_loopback_address_is_warned_about() -> None:
    assert exposure_warning(ServeConfig()) is None
    assert exposure_warning(ServeConfig(host="::1")) is None
    warning = exposure_warning(ServeConfig(host="0.0.0.0"))
    assert warning is not None
    assert "0.0.0.0" in warning and "clear text" in warning
    with_tls = exposure_warning(
        ServeConfig(host="0.0.0.0", tls_cert=Path("c.pem"), tls_key=Path("k.pem"))
    )
    assert with_tls is not None and "clear text" not in with_tls


def test_worker_plan_fills_the_cores_with_one_thread_each() -> None:
    import psutil

    from pipeline.serving.torchserve import worker_plan

    cores = psutil.cpu_count(logical=False) or 1
    assert worker_plan(1) == (cores, 1)
    assert worker_plan(cores * 4) == (1, 1)  # more models than cores: never below one
    assert worker_plan(1, workers=1) == (1, cores)
    assert worker_plan(3, workers=2, threads=5) == (2, 5)  # what the user asks for wins
