"""Why a served format is served, as `pipeline serve` and `status` say it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.serving.provenance import ServedInfo
from pipeline.serving.served import _why_served
from pipeline_runtime.manifest import ArtifactRecord, Manifest
from tests.manifests import digits_manifest


def test_a_served_format_without_a_recorded_reason_is_not_given_one(tmp_path: Path) -> None:
    # It said "the first archived format in registry order" of a .pt2 served by name.
    said = _why_served(
        ServedInfo("digits_lenet", "pt2", sha256="ab" * 32), tmp_path / "no-artifacts"
    )
    assert said == "as archived (no bench result or reason recorded with it)", said


def test_a_kept_archive_of_an_unsigned_version_is_not_called_signed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The rebuild warning said "signed version 1" in a store nothing was signed in.
    from pipeline.runtimes.torchserve.signed import to_rebuild

    version_dir = tmp_path / "store" / "digits_lenet" / "3"
    _manifest_with(version_dir, "0" * 64, "2026-11-29T00:00:00+00:00")
    mar = tmp_path / "digits_lenet_onnx.v3.mar"
    mar.write_bytes(b"not a zip")
    assert to_rebuild(mar, version_dir, "onnx", 3)
    said = capsys.readouterr().err
    assert "is not what archiving version 3 gives" in said and "signed" not in said, said


def _manifest_with(folder: Path, onnx_sha: str, created: str) -> Manifest:
    manifest = digits_manifest(
        {"onnx": ArtifactRecord("model.onnx", "onnx", onnx_sha)},
        checkpoint="checkpoint.pt",
        created=created,
    )
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(manifest.dumps())
    return manifest


def test_a_server_on_a_published_version_is_not_told_to_restart(tmp_path: Path) -> None:
    # A user's loop: the server serves the store's default (version 1) while the working
    # export is newer; "run `pipeline stop && pipeline serve ...` to serve this export"
    # served version 1 again, and the same message came back.
    import json

    from pipeline.serving.served import stale
    from pipeline.serving.server import Server

    store = tmp_path / "store"
    one = store / "digits_lenet" / "1"
    _manifest_with(one, "a" * 64, "2026-11-28T00:00:00+00:00")
    (one / "publish.json").write_text(json.dumps({"model": "digits_lenet", "version": 1}))
    mine = _manifest_with(tmp_path / "export", "b" * 64, "2026-11-29T00:00:00+00:00")
    info = ServedInfo("digits_lenet", "onnx", sha256="a" * 64, exported="2026-11-28T00:00:00+00:00")
    server = Server(
        runtime="kserve",
        pid=0,
        run_dir=str(tmp_path / "run"),
        inference_url="",
        metrics_url="",
        models=["digits_lenet"],
        served={"digits_lenet": info},
        extras={"store": str(store)},
    )
    said = stale("digits_lenet", info, mine, tmp_path / "export", server=server)
    assert said and f"from version 1 of its store ({one.resolve()})" in said, said
    assert f"--export-dir {one.resolve()}" in said and "pipeline stop" not in said, said
    # The store named on its command line (the KServe runtime records no store of its own).
    server = replace(
        server, extras={}, command=["serve", "--runtime", "kserve", "--store", str(store)]
    )
    said = stale("digits_lenet", info, mine, tmp_path / "export", server=server)
    assert said and "from version 1 of its store" in said, said
    # Started on an export folder whose bytes were published since: that folder is what it
    # serves, and a restart is still the way to serve the newer export.
    server = replace(server, command=["serve", "--runtime", "kserve", "--export-dir", "/old"])
    said = stale("digits_lenet", info, mine, tmp_path / "export", server=server)
    assert said and "of its store" not in said and "pipeline stop" in said, said


def test_an_export_already_published_is_rolled_out_not_published_again(tmp_path: Path) -> None:
    # After a rollback to version 1, the working export (version 2 already) was told to
    # `pipeline publish` it again, which makes a duplicate version (a user's trial).
    import json

    from pipeline.serving.served import stale
    from pipeline.serving.server import Server

    store = tmp_path / "store"
    for number, sha, when in ((1, "a", "2026-11-28"), (2, "b", "2026-11-29")):
        folder = store / "digits_lenet" / str(number)
        _manifest_with(folder, sha * 64, f"{when}T00:00:00+00:00")
        (folder / "publish.json").write_text(
            json.dumps({"model": "digits_lenet", "version": number})
        )
    mine = _manifest_with(tmp_path / "export", "b" * 64, "2026-11-29T00:00:00+00:00")
    info = ServedInfo("digits_lenet", "onnx", sha256="a" * 64, exported="2026-11-28T00:00:00+00:00")
    server = Server(
        runtime="kserve", pid=0, run_dir=str(tmp_path / "run"), inference_url="",
        metrics_url="", models=["digits_lenet"], served={"digits_lenet": info},
        extras={"store": str(store)},
    )  # fmt: skip
    said = stale("digits_lenet", info, mine, tmp_path / "export", server=server)
    assert said and "`pipeline rollout --model digits_lenet --version 2` (version 2 holds" in said
    assert "`pipeline publish`" not in said, said
