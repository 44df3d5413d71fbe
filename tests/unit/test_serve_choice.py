"""Which archives `pipeline serve` picks, and how a model name finds its served format."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from pipeline.client import ClientError, resolve_model
from pipeline.serve import Server, preferred_archives


def _mar(store: Path, name: str, manifest: dict) -> None:
    store.mkdir(exist_ok=True)
    with zipfile.ZipFile(store / f"{name}.mar", "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))


def test_the_fastest_verified_format_is_served_alone(tmp_path: Path) -> None:
    for suffix in ("ts", "onnx"):
        _mar(tmp_path, f"digits_lenet_{suffix}", {"fastest": {"backend": "onnxruntime"}})
        _mar(tmp_path, f"my_cell_{suffix}", {"fastest": {"backend": "torchscript_frozen"}})
        _mar(tmp_path, f"wrap_rnn_{suffix}", {})  # never benchmarked: both formats
    _mar(tmp_path, "only_ts", {"fastest": {"backend": "onnxruntime"}})
    archives = sorted(p.stem for p in tmp_path.glob("*.mar"))
    assert preferred_archives(tmp_path, archives) == [
        "digits_lenet_onnx",
        "my_cell_ts",
        "only_ts",
        "wrap_rnn_onnx",
        "wrap_rnn_ts",
    ]


def test_a_fastest_format_that_was_not_archived_keeps_what_was(tmp_path: Path) -> None:
    _mar(tmp_path, "digits_lenet_ts", {"fastest": {"backend": "onnxruntime"}})
    assert preferred_archives(tmp_path, ["digits_lenet_ts"]) == ["digits_lenet_ts"]


def _server(models: list[str]) -> Server:
    return Server(0, "/nonexistent", "http://x", "http://y", "http://z", models)


def test_a_model_name_finds_its_served_format() -> None:
    assert resolve_model(_server(["digits_lenet_onnx"]), "digits_lenet") == "digits_lenet_onnx"
    both = _server(["digits_lenet_onnx", "digits_lenet_ts"])
    assert resolve_model(both, "digits_lenet") == "digits_lenet_ts"
    assert resolve_model(both, "digits_lenet_onnx") == "digits_lenet_onnx"
    with pytest.raises(ClientError, match="does not serve my_cell"):
        resolve_model(both, "my_cell")
