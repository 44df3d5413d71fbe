"""server.json as an older `pipeline serve` wrote it still reads: what is served (then
`archives`) and TorchServe's management key (then not recorded by file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core import fileio
from pipeline.runtimes.torchserve.constants import KEY_FILE
from pipeline.runtimes.torchserve.management import management_headers
from pipeline.serving.server import INFERENCE_KEY_FILE, SERVER_FILE, ServeError, Server

OLD_RECORD = {
    "runtime": "torchserve",
    "pid": 0,
    "run_dir": "",
    "inference_url": "http://127.0.0.1:1",
    "metrics_url": "http://127.0.0.1:2",
    "models": ["digits_lenet_onnx"],
    "archives": {"digits_lenet_onnx": {"model": "digits_lenet", "format": "onnx", "sha256": "ab"}},
    "extras": {"management_url": "http://127.0.0.1:3"},
}


def test_an_older_record_reads_with_what_it_serves_and_its_management_key(tmp_path: Path) -> None:
    (tmp_path / SERVER_FILE).write_text(json.dumps({**OLD_RECORD, "run_dir": str(tmp_path)}))
    fileio.write_secret(tmp_path / KEY_FILE, {"management": {"key": "m-key"}})
    fileio.write_secret(tmp_path / INFERENCE_KEY_FILE, {"inference": {"key": "i-key"}})
    server = Server.load(tmp_path)
    assert server.served_of("digits_lenet") == {
        "digits_lenet_onnx": server.served["digits_lenet_onnx"]
    }
    assert server.served["digits_lenet_onnx"].format == "onnx"
    assert server.key_files == {}
    assert server.keys()["inference"] == "i-key"
    assert management_headers(server) == {"Authorization": "Bearer m-key"}
    # The record a new start writes names the file, and reads back the same.
    server.record()
    again = Server.load(tmp_path)
    assert again.served == server.served and "archives" not in json.loads(
        (tmp_path / SERVER_FILE).read_text()
    )


def test_a_key_the_server_does_not_have_is_a_clear_error(tmp_path: Path) -> None:
    fields = {k: v for k, v in OLD_RECORD.items() if k != "archives"}
    server = Server(**{**fields, "run_dir": str(tmp_path)})
    with pytest.raises(ServeError, match="has no management key"):
        server.keys()["management"]


def test_the_keys_are_a_mapping(tmp_path: Path) -> None:
    fields = {k: v for k, v in OLD_RECORD.items() if k != "archives"}
    keys = Server(
        **{**fields, "run_dir": str(tmp_path), "key_files": {"management": KEY_FILE}}
    ).keys()
    assert "management" in keys and "metrics" not in keys
    assert keys.get("metrics") is None
    assert sorted(keys) == ["inference", "management"]


def test_a_hint_names_the_run_folder_only_when_it_is_not_the_default(tmp_path: Path) -> None:
    """`stop it with pipeline stop` after `serve --run-dir X`, copied as printed, stopped
    the default folder's server (a user's trial, 2026-11-28)."""
    from pipeline.serving.server import default_run_dir, run_dir_flag

    assert run_dir_flag(default_run_dir()) == ""
    assert run_dir_flag(tmp_path / "run") == f" --run-dir {tmp_path / 'run'}"
