"""The typed manifest: round trip, schema 1 still loads, bad manifests say what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.errors import ArtifactError
from pipeline.core.manifest import read_manifest
from pipeline_runtime.manifest import SCHEMA, Manifest, ManifestError

# A schema-1 manifest as export wrote it before the typed manifest (trimmed).
SCHEMA_1 = {
    "format": "pipeline.manifest/1",
    "created": "2026-11-01T00:00:00+00:00",
    "model": {
        "name": "my_cell",
        "kwargs": {},
        "task": "rnn_teacher_step",
        "source": "zoo",
        "init": "trained",
    },
    "mode": "eval",
    "checkpoint": {"path": "../checkpoint.pt", "sha256": "ab" * 32, "metrics": {"val_loss": 0.1}},
    "inputs": [
        {"name": "x", "shape": ["batch", 4], "dtype": "float32", "low": -1.0, "high": 1.0},
        {"name": "h", "shape": ["batch", 4], "dtype": "float32", "low": -1.0, "high": 1.0},
    ],
    "outputs": [
        {"name": "new_h", "shape": ["batch", 4], "dtype": "float32"},
        {"name": "state", "shape": ["batch", 4], "dtype": "float32"},
    ],
    "tolerance": {"atol": 1e-5, "rtol": 1e-4},
    "serving": {"stack_requests": False},
    "artifacts": {
        "torchscript": {
            "file": "model.torchscript.pt",
            "format": "torchscript",
            "method": "script",
            "reason": "scripted",
            "sha256": "cd" * 32,
        },
        "golden": {
            "file": "golden.pt",
            "format": "torch.save (weights_only)",
            "batch": 4,
            "sha256": "ef" * 32,
        },
    },
    "versions": {"torch": "2.14.1"},
}


def test_schema_1_loads_typed() -> None:
    m = Manifest.from_json(SCHEMA_1)
    assert m.schema == SCHEMA
    assert m.input_names == ["x", "h"] and m.output_names == ["new_h", "state"]
    assert m.inputs[0].batch_axis == 0 and m.inputs[0].dynamic_axes() == {0: "batch"}
    assert m.serving.stack_requests is False and m.serving.image_size is None
    ts = m.artifact("torchscript")
    assert (ts.file, ts.format, ts.reason, ts.get("method")) == (
        "model.torchscript.pt",
        "torchscript",
        "scripted",
        "script",
    )
    assert m.artifact("golden").get("batch") == 4


def test_round_trip_keeps_every_field() -> None:
    m = Manifest.from_json(SCHEMA_1)
    again = Manifest.loads(m.dumps())
    assert again == m
    assert json.loads(m.dumps())["artifacts"]["torchscript"]["method"] == "script"


def test_failed_formats_round_trip_and_are_absent_when_none() -> None:
    """A partial export lists what it could not write; complete ones carry no `failed` key."""
    assert Manifest.from_json(SCHEMA_1).failed == {}
    assert "failed" not in json.loads(Manifest.from_json(SCHEMA_1).dumps())
    why = "ONNX has no conversion for aten.linalg_eig (torch.linalg.eigvals)"
    m = Manifest.from_json({**SCHEMA_1, "failed": {"onnx": why}})
    assert m.failed == {"onnx": why}
    assert Manifest.loads(m.dumps()) == m
    assert json.loads(m.dumps())["failed"] == {"onnx": why}
    with pytest.raises(ManifestError, match=r"no 'onnx' artifact \(its export failed: ONNX has"):
        m.artifact("onnx")


def test_init_note_round_trips() -> None:
    note = "34 normalisation layers' running statistics calibrated on 4 random batches of 8"
    data = {**SCHEMA_1, "model": {**SCHEMA_1["model"], "init": "random", "init_note": note}}
    m = Manifest.from_json(data)
    assert (m.model.init, m.model.init_note) == ("random", note)
    assert Manifest.loads(m.dumps()) == m
    assert "init_note" not in Manifest.from_json(SCHEMA_1).to_json()["model"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "pipeline.manifest/0"}, "schema"),
        ({"inputs": []}, "no inputs"),
        ({"outputs": [{"name": "y", "shape": ["batch"], "dtype": "float32"}] * 2}, "repeat"),
        ({"checkpoint": {"path": "x"}}, "sha256"),
        ({"artifacts": {"onnx": {"file": "../../etc/passwd", "sha256": "0"}}}, "outside"),
        ({"tolerance": {"atol": "much", "rtol": 1}}, "wrong type"),
        ({"failed": {"torchscript": "it failed"}}, "both as written and as failed"),
        ({"failed": ["onnx"]}, "wrong type"),
    ],
)
def test_bad_manifests_are_refused_with_the_reason(change: dict, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json({**SCHEMA_1, **change})


def test_read_manifest_says_re_export(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({**SCHEMA_1, "format": "something/9"}))
    with pytest.raises(ArtifactError, match=r"Re-export with this version"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match=r"No export found"):
        read_manifest(tmp_path)
