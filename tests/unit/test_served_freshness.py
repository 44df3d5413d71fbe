"""A server answering from another export than the one checked is said so, in one sentence.

`served.stale` compares what an archive records about its export (archive.json:
artifact and checkpoint sha256, export time) with an export's manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.serving.provenance import ServedInfo
from pipeline.serving.served import export_format, freshness, stale
from pipeline.serving.server import ServeError, Server
from pipeline_runtime.manifest import (
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    TensorRecord,
    Tolerance,
)

OLD, NEW = "2026-11-23T10:02:11+00:00", "2026-11-23T10:15:40+00:00"


def _manifest(artifact_sha: str, checkpoint_sha: str, created: str, *formats: str) -> Manifest:
    return Manifest(
        model=ModelRecord("digits_lenet"),
        inputs=(TensorRecord("image", ("batch", 1, 28, 28), "float32"),),
        outputs=(TensorRecord("logits", ("batch", 10), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("../checkpoint.pt", checkpoint_sha),
        artifacts={
            f: ArtifactRecord(f"model.{f}", f, artifact_sha) for f in formats or ("torchscript",)
        },
        created=created,
    )


def _served(artifact_sha: str, checkpoint_sha: str, created: str) -> ServedInfo:
    return ServedInfo.of(_manifest(artifact_sha, checkpoint_sha, created), "torchscript")


EXPORT = Path("artifacts/digits_lenet/export")


def test_the_same_export_is_not_stale() -> None:
    assert (
        stale("digits_lenet_ts", _served("a1", "d3e7", OLD), _manifest("a1", "d3e7", OLD), EXPORT)
        is None
    )


def test_an_older_served_archive_is_named_with_both_checkpoints_and_the_fix() -> None:
    info = _served("a1" * 32, "d3e7f13a" + "0" * 56, OLD)
    sentence = stale(
        "digits_lenet_ts", info, _manifest("b2" * 32, "d2bc9911" + "0" * 56, NEW), EXPORT
    )
    assert sentence is not None
    assert "the served model is the older" in sentence
    assert "d3e7f13a" in sentence and "d2bc9911" in sentence
    assert OLD in sentence and NEW in sentence
    assert "`pipeline archive --model digits_lenet && pipeline stop && pipeline serve`" in sentence
    assert str(EXPORT) in sentence and "digits_lenet_ts" in sentence
    assert sentence.count(". ") == 0  # one sentence


def test_an_older_export_is_named_as_the_older() -> None:
    sentence = stale(
        "digits_lenet_ts", _served("a1", "c1", NEW), _manifest("b2", "c0", OLD), EXPORT
    )
    assert sentence is not None and "the export is the older" in sentence


def test_a_re_export_of_the_same_checkpoint_is_still_another_export() -> None:
    """Another opset or exporter, same weights: the artifact differs, the checkpoint not."""
    sentence = stale(
        "digits_lenet_ts", _served("a1", "c1", OLD), _manifest("b2", "c1", NEW), EXPORT
    )
    assert sentence is not None and "the served model is the older" in sentence


def test_archives_from_before_the_record_compare_by_artifact_only() -> None:
    legacy = ServedInfo("digits_lenet", "torchscript", "a1")  # no checkpoint, no time
    sentence = stale("digits_lenet_ts", legacy, _manifest("b2", "c1", NEW), EXPORT)
    assert sentence is not None and "which is older is not recorded" in sentence
    assert (
        stale("x", ServedInfo("digits_lenet", "torchscript"), _manifest("b2", "c1", NEW), EXPORT)
        is None
    )


def test_the_kserve_runtime_is_told_to_restart_not_to_archive() -> None:
    sentence = stale(
        "digits_lenet",
        _served("a1", "c1", OLD),
        _manifest("b2", "c2", NEW),
        EXPORT,
        runtime="kserve",
    )
    assert sentence is not None
    assert "`pipeline stop && pipeline serve --runtime kserve --model digits_lenet`" in sentence


def test_freshness_reads_the_export_on_disk(tmp_path: Path) -> None:
    manifest = _manifest("b2", "c2", NEW)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest.to_json()))
    archives = {"digits_lenet_ts": _served("a1", "c1", OLD)}
    fresh, why = freshness(archives, "digits_lenet_ts", tmp_path)
    assert fresh is False and "the served model is the older" in why
    same = {"digits_lenet_ts": ServedInfo.of(manifest, "torchscript")}
    fresh, why = freshness(same, "digits_lenet_ts", tmp_path)
    assert fresh is True and "serves the export in" in why
    fresh, why = freshness(archives, "digits_lenet_ts", tmp_path / "nowhere")
    assert fresh is None and "no export of digits_lenet" in why
    fresh, why = freshness({}, "foreign", tmp_path)
    assert fresh is None and "records no export" in why


def test_freshness_with_the_callers_manifest_reads_nothing(tmp_path: Path) -> None:
    from tests.manifest_reads import counted

    manifest = _manifest("b2", "c2", NEW)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest.to_json()))
    same = {"digits_lenet_ts": ServedInfo.of(manifest, "torchscript")}
    with counted() as reads:
        fresh, _ = freshness(same, "digits_lenet_ts", tmp_path, manifest=manifest)
    assert fresh is True and not reads
    with counted() as reads:  # the counter sees a read (it can fail the tests that use it)
        freshness(same, "digits_lenet_ts", tmp_path)
        freshness(same, "digits_lenet_ts", tmp_path)
    assert reads == {tmp_path.resolve(): 2}


def test_the_served_format_of_an_export_follows_bench_then_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))  # no bench run there
    manifest = _manifest("a", "c", NEW, "onnx", "torchscript", "pt2")
    assert export_format(manifest, bench_results=None) == "torchscript"
    fastest = tmp_path / "fastest.json"
    fastest.write_text(json.dumps({"digits_lenet": {"format": "onnx", "backend": "onnxruntime"}}))
    assert export_format(manifest, bench_results=fastest) == "onnx"
    fastest.write_text(json.dumps({"digits_lenet": {"format": "openvino"}}))  # not held: ignored
    assert export_format(manifest, bench_results=fastest) == "torchscript"
    with pytest.raises(ServeError, match="no servable artifact"):
        export_format(_manifest("a", "c", NEW, "tflite"), bench_results=None)


def test_a_served_format_the_export_no_longer_holds_is_stale() -> None:
    """Served as .pt2, then exported again without --format pt2."""
    pt2 = ServedInfo.of(_manifest("a1", "c1", OLD, "pt2"), "pt2")
    sentence = stale("digits_lenet_pt2", pt2, _manifest("b2", "c2", NEW, "torchscript"), EXPORT)
    assert sentence is not None and "the served model is the older" in sentence


def _recorded(runtime: str, run_dir: Path, command: list[str]) -> Server:
    return Server(runtime, 1, str(run_dir), "http://127.0.0.1:19001", "", [], command=command)


def test_the_fix_restarts_the_server_as_it_was_started(tmp_path: Path) -> None:
    """Its port, models and folders: a bare `pipeline stop && pipeline serve` acted on the
    default run folder's server and served on port 8080."""
    served = _served("a1", "c1", OLD)
    command = ["--artifacts-dir", "my art", "serve", "--runtime", "kserve", "--port", "19001"]
    server = _recorded("kserve", tmp_path / "run", command)
    sentence = stale("digits_lenet", served, _manifest("b2", "c2", NEW), EXPORT, server=server)
    assert sentence is not None
    fix = (
        f"`pipeline stop --run-dir {tmp_path / 'run'} && pipeline --artifacts-dir 'my art' serve "
        "--runtime kserve --port 19001`"
    )
    assert fix in sentence


def test_torchserve_s_fix_archives_the_export_checked_into_the_server_s_store(
    tmp_path: Path,
) -> None:
    export = tmp_path / "elsewhere" / "export"
    export.mkdir(parents=True)
    command = ["serve", "--store=shop", "--run-dir", str(tmp_path / "run")]
    server = _recorded("torchserve", tmp_path / "run", command)
    sentence = stale(
        "digits_lenet_ts",
        _served("a1", "c1", OLD),
        _manifest("b2", "c2", NEW),
        export,
        server=server,
    )
    assert sentence is not None
    assert (
        f"`pipeline archive --model digits_lenet --export-dir {export} --store shop && "
        f"pipeline stop --run-dir {tmp_path / 'run'} && pipeline serve --store=shop --run-dir "
        f"{tmp_path / 'run'}`"
    ) in sentence
