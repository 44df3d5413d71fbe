"""Which archives `pipeline serve` picks, and how a model name finds its served archive.

Both read what the archives say about themselves (`archive.json`: model,
format, the fastest backend bench measured), never the archive names.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from pipeline.formats import base as registry
from pipeline.runtimes.torchserve.constants import ARCHIVE_INFO
from pipeline.runtimes.torchserve.launch import Server
from pipeline.runtimes.torchserve.store import aliases, expand, preferred_archives
from pipeline.serving.client import ClientError, resolve_model
from pipeline.serving.provenance import ServedInfo


def _mar(store: Path, name: str, model: str, fastest: dict[str, Any] | None = None) -> None:
    store.mkdir(exist_ok=True)
    fmt = registry.by_suffix(name.rpartition("_")[2]).key  # as `pipeline archive` names it
    with zipfile.ZipFile(store / f"{name}.mar", "w") as zf:
        zf.writestr(ARCHIVE_INFO, json.dumps(ServedInfo(model, fmt, "", fastest).to_json()))


ONNX_FASTEST = {"backend": "onnxruntime", "format": "onnx"}


def test_one_format_per_model_the_fastest_verified_else_torchscript(tmp_path: Path) -> None:
    for suffix in ("ts", "onnx"):
        _mar(tmp_path, f"digits_lenet_{suffix}", "digits_lenet", ONNX_FASTEST)
        frozen = {"backend": "torchscript_frozen", "format": "torchscript"}
        _mar(tmp_path, f"my_cell_{suffix}", "my_cell", frozen)
        _mar(tmp_path, f"wrap_rnn_{suffix}", "wrap_rnn")  # never benchmarked: TorchScript
    _mar(tmp_path, "only_ts", "only", ONNX_FASTEST)
    archives = sorted(p.stem for p in tmp_path.glob("*.mar"))
    assert preferred_archives(tmp_path, archives) == [
        "digits_lenet_onnx",
        "my_cell_ts",
        "only_ts",
        "wrap_rnn_ts",
    ]


def test_a_fastest_format_that_was_not_archived_keeps_what_was(tmp_path: Path) -> None:
    _mar(tmp_path, "digits_lenet_ts", "digits_lenet", ONNX_FASTEST)
    assert preferred_archives(tmp_path, ["digits_lenet_ts"]) == ["digits_lenet_ts"]


def test_the_choice_goes_by_archive_json_not_by_name(tmp_path: Path) -> None:
    """Names that look like one model's two formats, and a foreign archive."""
    _mar(tmp_path, "x_ts", "x", ONNX_FASTEST)
    _mar(tmp_path, "x_onnx", "x", ONNX_FASTEST)
    # Two models, each archived once: split at the last underscore they would
    # look like one model "a_b" in two formats, and one would not be served.
    _mar(tmp_path, "a_b_onnx", "a", ONNX_FASTEST)
    _mar(tmp_path, "a_b_ts", "a_b", ONNX_FASTEST)
    with zipfile.ZipFile(tmp_path / "foreign_ts.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", "{}")  # no archive.json: always kept
    archives = sorted(p.stem for p in tmp_path.glob("*.mar"))
    assert preferred_archives(tmp_path, archives) == ["a_b_onnx", "a_b_ts", "foreign_ts", "x_onnx"]


def test_serve_models_takes_archive_and_model_names(tmp_path: Path) -> None:
    _mar(tmp_path, "digits_lenet_ts", "digits_lenet")
    _mar(tmp_path, "digits_lenet_onnx", "digits_lenet")
    _mar(tmp_path, "torchvision_resnet18_onnx", "torchvision:resnet18", ONNX_FASTEST)
    _mar(tmp_path, "torchvision_resnet18_ts", "torchvision:resnet18", ONNX_FASTEST)
    archives = sorted(p.stem for p in tmp_path.glob("*.mar"))
    assert expand(tmp_path, archives, ["digits_lenet"]) == ["digits_lenet_ts"]
    assert expand(tmp_path, archives, ["digits_lenet_onnx"]) == ["digits_lenet_onnx"]
    assert expand(tmp_path, archives, ["torchvision:resnet18"]) == ["torchvision_resnet18_onnx"]
    assert expand(tmp_path, archives, ["torchvision_resnet18"]) == ["torchvision_resnet18_onnx"]
    assert expand(tmp_path, archives, ["digits_lenet"], every=True) == [
        "digits_lenet_onnx",
        "digits_lenet_ts",
    ]
    with pytest.raises(ValueError, match="my_cell: no such archive or archived model"):
        expand(tmp_path, archives, ["digits_lenet", "my_cell"])


def _server(archives: dict[str, tuple[str, str]]) -> Server:
    return Server(
        0,
        "/nonexistent",
        "http://x",
        "http://y",
        "http://z",
        list(archives),
        served={name: ServedInfo(model, fmt) for name, (model, fmt) in archives.items()},
    )


def test_a_model_name_finds_its_served_format() -> None:
    onnx = _server({"digits_lenet_onnx": ("digits_lenet", "onnx")})
    assert resolve_model(onnx, "digits_lenet") == "digits_lenet_onnx"
    both = _server(
        {
            "digits_lenet_onnx": ("digits_lenet", "onnx"),
            "digits_lenet_ts": ("digits_lenet", "torchscript"),
        }
    )
    assert resolve_model(both, "digits_lenet") == "digits_lenet_ts"
    assert resolve_model(both, "digits_lenet_onnx") == "digits_lenet_onnx"
    assert resolve_model(both, "digits_lenet", "onnx") == "digits_lenet_onnx"
    with pytest.raises(ClientError, match="does not serve my_cell"):
        resolve_model(both, "my_cell")
    with pytest.raises(ClientError, match="does not serve digits_lenet as pt2"):
        resolve_model(both, "digits_lenet", "pt2")


def test_a_user_model_spec_finds_its_archive() -> None:
    server = _server({"torchvision_resnet18_onnx": ("torchvision:resnet18", "onnx")})
    assert resolve_model(server, "torchvision:resnet18") == "torchvision_resnet18_onnx"


def test_a_user_model_file_is_found_by_its_folder_name_too() -> None:
    # `pipeline archive` names the archives my_model_MyModel_<suffix> and `serve --models`
    # takes my_model_MyModel; `infer --model my_model_MyModel` once said the server did not
    # serve it ("it serves my_model_MyModel_ts").
    server = _server({"my_model_MyModel_ts": ("models/my_model.py:MyModel", "torchscript")})
    assert resolve_model(server, "models/my_model.py:MyModel") == "my_model_MyModel_ts"
    assert resolve_model(server, "my_model_MyModel") == "my_model_MyModel_ts"
    with pytest.raises(ClientError, match="does not serve my_model_Other"):
        resolve_model(server, "my_model_Other")


def test_a_failed_archive_is_not_picked() -> None:
    server = _server(
        {
            "digits_lenet_ts": ("digits_lenet", "torchscript"),
            "digits_lenet_onnx": ("digits_lenet", "onnx"),
        }
    )
    failed = Server(**{**server.__dict__, "failed": ["digits_lenet_ts"]})
    assert resolve_model(failed, "digits_lenet") == "digits_lenet_onnx"


def test_a_model_served_in_one_format_is_reachable_by_its_name() -> None:
    server = _server(
        {
            "digits_lenet_onnx": ("digits_lenet", "onnx"),
            "my_cell_ts": ("my_cell", "torchscript"),
            "my_cell_onnx": ("my_cell", "onnx"),  # two formats: the name would be ambiguous
            "torchvision_resnet18_pt2": ("torchvision:resnet18", "pt2"),
        }
    )
    assert aliases(server) == {
        "digits_lenet": "digits_lenet_onnx",
        "torchvision:resnet18": "torchvision_resnet18_pt2",
        "torchvision_resnet18": "torchvision_resnet18_pt2",
    }


def test_server_json_round_trips_the_archive_records(tmp_path: Path) -> None:
    server = _server({"digits_lenet_ts": ("digits_lenet", "torchscript")})
    recorded = Server(**{**server.__dict__, "run_dir": str(tmp_path)})
    recorded.record()
    assert Server.load(tmp_path) == recorded


def test_a_zero_batch_delay_with_batching_is_refused(tmp_path: Path) -> None:
    """TorchServe 0.12 reads maxBatchDelay 0 as unset and waits its 100 ms default."""
    from pipeline.runtimes.torchserve.archive import ArchiveConfig, ArchiveError

    with pytest.raises(ArchiveError, match="100 ms"):
        ArchiveConfig(batch_size=8, max_batch_delay_ms=0).validate()
    ArchiveConfig(batch_size=1, max_batch_delay_ms=0).validate()  # no batch: no wait
    assert ArchiveConfig().max_batch_delay_ms == 1  # the measured default
