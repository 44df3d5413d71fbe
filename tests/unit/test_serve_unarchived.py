"""`pipeline serve` on TorchServe from a store whose model is published but not archived:
TorchServe serves archives only, so the message names the command that archives the
store's default version (the KServe and Ray runtimes serve the version as it is)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.runtimes.torchserve.launch import ServeConfig, start
from pipeline.serving import versions
from pipeline.serving.server import ServeError
from tests.unit.test_serve_choice import _mar
from tests.unit.test_serve_needs_java import _java


def _published(store: Path, model: str, number: int) -> None:
    folder = store / model / str(number)
    folder.mkdir(parents=True)
    (folder / versions.PROVENANCE).write_text(json.dumps({"model": model, "version": number}))
    versions.write_pointer(model, versions.Pointer(number, []), store)


@pytest.mark.parametrize("models", [None, ["digits_lenet"]])
def test_a_published_model_without_an_archive_is_named_with_the_command_that_archives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models: list[str] | None
) -> None:
    monkeypatch.setenv("PATH", str(_java(tmp_path / "bin").parent))  # past the Java check
    store = tmp_path / "store"
    _published(store, "digits_lenet", 2)
    config = ServeConfig(store=store, run_dir=tmp_path / "run", models=models)
    with pytest.raises(ServeError) as refused:
        start(config)
    said = str(refused.value)
    assert f"`pipeline archive --model digits_lenet --store {store.resolve()}`" in said, said
    assert "(its default, version 2)" in said and "--runtime kserve" in said, said
    assert not (tmp_path / "run").exists()  # nothing started


def test_an_empty_store_says_only_to_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(_java(tmp_path / "bin").parent))
    (tmp_path / "store").mkdir()
    with pytest.raises(ServeError, match="Run `pipeline archive`") as refused:
        start(ServeConfig(store=tmp_path / "store", run_dir=tmp_path / "run"))
    assert "Published in the store" not in str(refused.value)


def test_beside_other_archives_the_unarchived_one_asked_for_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(_java(tmp_path / "bin").parent))
    store = tmp_path / "store"
    _published(store, "my_cell", 3)
    _mar(store, "digits_lenet_onnx", "digits_lenet")  # archived (never published); my_cell not
    config = ServeConfig(store=store, run_dir=tmp_path / "run", models=["my_cell"])
    with pytest.raises(ServeError) as refused:
        start(config)
    said = str(refused.value)
    assert "`pipeline archive --model my_cell --store" in said and "version 3)" in said, said
    assert "--model digits_lenet" not in said, said
