"""The KServe runtime's key files (pipeline.runtimes.kserve.tokens), its /metrics rule in the
ASGI `Guard`, and which key files `pipeline stop` leaves (issue 28, point 4), in-process.

The Guard is driven through httpx's ASGITransport, whose scope["server"] is the URL's
host: the address a connection arrived on. No kserve import (it parses sys.argv).
"""

from __future__ import annotations

import asyncio
import json
import logging
import stat
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from pipeline.core import fileio
from pipeline.runtimes.kserve.launch import write_tokens
from pipeline.runtimes.kserve.security import Guard, is_loopback
from pipeline.runtimes.kserve.tokens import KeyFileError, ensure_key, new_key, read_key
from pipeline.runtimes.torchserve.constants import KEY_FILE
from pipeline.serving.guard import WWW_AUTHENTICATE, Keys
from pipeline.serving.launcher import stop
from pipeline.serving.server import INFERENCE_KEY_FILE, Server

INFER = "/v2/models/digits/infer"
TOKEN = "i" * 43
METRICS_TOKEN = "m" * 43


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _key(path: Path, kind: str = "inference") -> str:
    return json.loads(path.read_text())[kind]["key"]


# --- the inference token outlives a start ---------------------------------------------------------


def test_a_fit_key_file_is_kept_and_rotate_replaces_it(tmp_path: Path) -> None:
    path = tmp_path / INFERENCE_KEY_FILE
    first = ensure_key(path)
    assert first.action == "new" and _mode(path) == 0o600
    key = _key(path)
    assert len(key) >= 43 and read_key(path) == key
    again = ensure_key(path)
    assert again.action == "kept" and not again.changed and _key(path) == key
    rotated = ensure_key(path, rotate=True)
    assert rotated.action == "rotated" and rotated.changed
    assert _key(path) != key and _mode(path) == 0o600


def _bad_json(path: Path) -> None:
    fileio.write_secret(path, {"inference": {"key": TOKEN}})
    path.write_text('{"inference": {"key": ')  # cut short: still 0600


def _world_readable(path: Path) -> None:
    fileio.write_secret(path, {"inference": {"key": TOKEN}})
    path.chmod(0o644)


def _group_writable(path: Path) -> None:
    fileio.write_secret(path, {"inference": {"key": TOKEN}})
    path.chmod(0o620)


def _short_key(path: Path) -> None:
    fileio.write_secret(path, {"inference": {"key": "AbCd1234"}})  # TorchServe's 48 bits


def _no_key(path: Path) -> None:
    fileio.write_secret(path, {"inference": {"token": TOKEN}})


def _a_link(path: Path) -> None:
    target = fileio.write_secret(path.with_name("elsewhere.json"), {"inference": {"key": TOKEN}})
    path.symlink_to(target)


def _a_folder(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (_bad_json, "is not JSON"),
        (_world_readable, "has mode 0644, not 0600"),
        (_group_writable, "has mode 0620, not 0600"),
        (_short_key, "holds a key this runtime did not write"),
        (_no_key, 'holds no {"inference": {"key": ...}}'),
        (_a_link, "is a symbolic link"),
    ],
)
def test_an_unfit_key_file_is_replaced_and_the_log_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tamper: Any, reason: str
) -> None:
    path = tmp_path / INFERENCE_KEY_FILE
    tamper(path)
    with pytest.raises(KeyFileError, match=reason):
        read_key(path)
    with caplog.at_level(logging.INFO, logger="pipeline.runtimes.kserve.tokens"):
        state = ensure_key(path)
    assert state.action == "replaced" and state.changed and reason in state.reason
    assert not path.is_symlink() and _mode(path) == 0o600
    assert _key(path) != TOKEN and read_key(path) == _key(path)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in line and reason in line and "clients must read it again" in line
    assert _key(path) not in caplog.text  # the key itself is never logged
    if tamper is _a_link:  # the link was replaced, not written through
        assert _key(path.with_name("elsewhere.json")) == TOKEN


def test_a_key_file_that_cannot_be_replaced_is_a_clean_error(tmp_path: Path) -> None:
    from pipeline.serving.server import ServeError

    path = tmp_path / INFERENCE_KEY_FILE
    _a_folder(path)
    with pytest.raises(KeyFileError, match="is not a regular file"):
        read_key(path)
    with pytest.raises(ServeError, match="Cannot write the inference token"):
        ensure_key(path)


def test_a_missing_key_file_is_written_with_an_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / INFERENCE_KEY_FILE
    with caplog.at_level(logging.INFO, logger="pipeline.runtimes.kserve.tokens"):
        assert ensure_key(path).action == "new"
    assert "wrote a new inference token (there was none)" in caplog.text


def test_the_metrics_key_is_written_off_loopback_only(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert set(write_tokens(tmp_path / "a", "127.0.0.1")) == {"inference"}
    assert not (tmp_path / "a" / "metrics_key.json").exists()
    (tmp_path / "b").mkdir()
    states = write_tokens(tmp_path / "b", "0.0.0.0")
    assert set(states) == {"inference", "metrics"}
    metrics = tmp_path / "b" / "metrics_key.json"
    assert _mode(metrics) == 0o600 and _key(metrics, "metrics") != _key(
        tmp_path / "b" / INFERENCE_KEY_FILE
    )
    again = write_tokens(tmp_path / "b", "0.0.0.0")
    assert again["metrics"].action == "kept" and again["inference"].action == "kept"
    rotated = write_tokens(tmp_path / "b", "0.0.0.0", rotate=True)
    assert {s.action for s in rotated.values()} == {"rotated"}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("::ffff:10.0.0.5", False),
        ("example.com", False),
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(host: str | None, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# --- /metrics in the Guard ------------------------------------------------------------------------


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _run_dir(tmp_path: Path, metrics: bool = True) -> Keys:
    fileio.write_secret(tmp_path / INFERENCE_KEY_FILE, {"inference": {"key": TOKEN}})
    if metrics:
        fileio.write_secret(tmp_path / "metrics_key.json", {"metrics": {"key": METRICS_TOKEN}})
    return Keys(tmp_path / INFERENCE_KEY_FILE)


def _get(guard: Guard, url: str, token: str | None = None, method: str = "GET") -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport) as client:
            return await client.request(method, url, headers=headers)

    return asyncio.run(call())


@pytest.mark.parametrize("host", ["10.0.0.5", "0.0.0.0", "::", "192.168.1.20"])
def test_off_loopback_metrics_need_the_metrics_key_not_the_inference_token(
    tmp_path: Path, host: str
) -> None:
    guard = Guard(_ok, keys=_run_dir(tmp_path), max_body=1024, host=host)
    # Whatever address the connection arrived on, the listening address decides.
    for url in ("http://10.0.0.5:8085/metrics", "http://127.0.0.1:8085/metrics"):
        for token in (None, "wrong", TOKEN):  # TOKEN: the inference token alone is refused
            r = _get(guard, url, token)
            assert r.status_code == 401, (url, token, r.text)
            assert r.headers["www-authenticate"] == WWW_AUTHENTICATE
            assert "metrics token" in r.json()["error"]
        assert _get(guard, url, METRICS_TOKEN).status_code == 200
    # ... and the metrics key runs no model.
    r = _get(guard, f"http://10.0.0.5:8085{INFER}", METRICS_TOKEN, "POST")
    assert r.status_code == 401 and "inference token" in r.json()["error"]
    assert _get(guard, f"http://10.0.0.5:8085{INFER}", TOKEN, "POST").status_code == 200


def test_off_loopback_without_a_metrics_key_file_metrics_stay_closed(tmp_path: Path) -> None:
    guard = Guard(_ok, keys=_run_dir(tmp_path, metrics=False), max_body=1024, host="0.0.0.0")
    for token in (None, TOKEN, ""):
        assert _get(guard, "http://10.0.0.5/metrics", token).status_code == 401


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_on_loopback_metrics_are_open_and_the_rest_still_needs_the_token(
    tmp_path: Path, host: str
) -> None:
    guard = Guard(_ok, keys=_run_dir(tmp_path), max_body=1024, host=host)
    for token in (None, "wrong", METRICS_TOKEN):
        assert _get(guard, "http://127.0.0.1/metrics", token).status_code == 200
    for token in (None, METRICS_TOKEN):
        assert _get(guard, f"http://127.0.0.1{INFER}", token, "POST").status_code == 401
    assert _get(guard, "http://127.0.0.1/v2/models/digits", None).status_code == 401
    assert _get(guard, "http://127.0.0.1/metrics", None, "POST").status_code == 405


def test_without_a_listening_address_the_connection_decides(tmp_path: Path) -> None:
    guard = Guard(_ok, keys=_run_dir(tmp_path), max_body=1024)  # as the runtime builds it
    assert _get(guard, "http://127.0.0.1:8085/metrics").status_code == 200
    assert _get(guard, "http://[::1]:8085/metrics").status_code == 200
    assert _get(guard, "http://10.0.0.5:8085/metrics").status_code == 401
    assert _get(guard, "http://10.0.0.5:8085/metrics", TOKEN).status_code == 401
    assert _get(guard, "http://10.0.0.5:8085/metrics", METRICS_TOKEN).status_code == 200


def test_without_keys_metrics_are_open_everywhere(tmp_path: Path) -> None:
    # A pod behind KServe's mesh (pipeline deploy kserve): no token on any route.
    guard = Guard(_ok, keys=None, max_body=1024, host="0.0.0.0")
    assert _get(guard, "http://10.0.0.5/metrics").status_code == 200


# --- pipeline stop and the key files --------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    ("runtime", "marker", "left"),
    [
        # The KServe runtime's stop deletes no key file (TorchServe's would be its own).
        ("kserve", "kserve.json", {INFERENCE_KEY_FILE, KEY_FILE, "metrics_key.json"}),
        # TorchServe's deletes the keys it minted at its start, as before.
        ("torchserve", "config.properties", {"metrics_key.json"}),
    ],
)
def test_stop_leaves_the_kserve_token_and_removes_torchserve_keys(
    tmp_path: Path, runtime: str, marker: str, left: set[str]
) -> None:
    for name in (INFERENCE_KEY_FILE, KEY_FILE, "metrics_key.json"):
        fileio.write_secret(tmp_path / name, {"inference": {"key": new_key()}})
    Server(
        runtime=runtime,
        pid=_dead_pid(),  # a stale record: nothing to signal
        run_dir=str(tmp_path),
        inference_url="http://127.0.0.1:1",
        metrics_url="http://127.0.0.1:1",
        models=[],
        markers=[marker],
    ).record()
    stop(tmp_path, timeout=1)
    assert {p.name for p in tmp_path.iterdir()} == left
