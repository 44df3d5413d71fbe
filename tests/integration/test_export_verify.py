"""Export to TorchScript + ONNX, verify parity, and prove verify can fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from pipeline.core.errors import ArtifactError, CheckpointError
from pipeline.core.fileio import sha256_file, write_json
from pipeline.core.manifest import MANIFEST_NAME
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.train import TrainResult
from pipeline.verify import VerifyConfig, verify


def _copy_export(exported: ExportResult, tmp_path: Path) -> Path:
    """A private copy, so a test that tampers with files leaves the shared one intact."""
    dst = tmp_path / "export"
    shutil.copytree(exported.out_dir, dst)
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    # The checkpoint path is relative to the export folder; make it absolute.
    manifest["checkpoint"]["path"] = str(
        (exported.out_dir / manifest["checkpoint"]["path"]).resolve()
    )
    write_json(dst / MANIFEST_NAME, manifest)
    return dst


def test_manifest_records_how_and_why(exported: ExportResult) -> None:
    m = exported.manifest.to_json()
    assert m["mode"] == "eval"
    ts, ox = m["artifacts"]["torchscript"], m["artifacts"]["onnx"]
    assert ts["method"] == "trace" and "probe inputs" in ts["reason"]
    assert ox["opset"] == 18 and "AveragePool" in ox["opset_reason"]
    assert ox["exporter"].startswith("torch.export")
    assert m["inputs"] == [
        {
            "name": "image",
            "shape": ["batch", 1, 28, 28],
            "dtype": "float32",
            "low": 0.0,
            "high": 1.0,
        }
    ]
    assert m["outputs"] == [{"name": "logits", "shape": ["batch", 10], "dtype": "float32"}]
    assert m["tolerance"] == {"atol": 1e-5, "rtol": 1e-4}
    for key in ("torch", "onnx", "onnxruntime", "onnxscript", "python"):
        assert m["versions"][key]
    for art in m["artifacts"].values():
        assert sha256_file(exported.out_dir / art["file"]) == art["sha256"]


def test_onnx_batch_axis_is_dynamic(exported: ExportResult) -> None:
    model = onnx.load(str(exported.out_dir / "model.onnx"))
    assert {o.domain: o.version for o in model.opset_import}[""] == 18
    dim0 = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param == "batch"


def test_golden_file_loads_weights_only(exported: ExportResult) -> None:
    golden = torch.load(exported.out_dir / "golden.pt", weights_only=True)
    assert golden["inputs"]["image"].shape == (8, 1, 28, 28)
    assert golden["outputs"]["logits"].shape == (8, 10)


def test_verify_passes_on_every_backend_and_case(exported: ExportResult, tmp_path: Path) -> None:
    report = verify(VerifyConfig(export_dir=exported.out_dir, report=tmp_path / "parity.json"))
    assert report.passed, report.failure_message()
    backends = {r.backend for r in report.rows}
    # every format, the on-device .pte in ExecuTorch's runtime too
    assert backends == {"golden file", "torchscript", "onnxruntime", "pt2", "executorch"}
    cases = {r.inputs for r in report.rows}
    assert {"golden", "random b=1", "random b=7"} <= cases
    assert any(c.startswith("probe") for c in cases)
    on_disk = json.loads((tmp_path / "parity.json").read_text())
    assert on_disk["passed"] is True and on_disk["checks"] == len(report.rows)
    assert all(row["max_abs"] <= row["atol"] + 1e-3 for row in on_disk["rows"])


def test_export_in_train_mode_fails_verify(trained: TrainResult, tmp_path: Path) -> None:
    """The forgotten-eval() bug: Dropout and batch-statistics BatchNorm in the artifacts."""
    result = export(
        ExportConfig(
            checkpoint=trained.checkpoint.path, out_dir=tmp_path / "export", train_mode=True
        )
    )
    assert result.manifest.mode == "train"
    report = verify(VerifyConfig(export_dir=result.out_dir, report=tmp_path / "parity.json"))
    assert not report.passed
    failed = {r.backend for r in report.failures}
    assert {"torchscript", "onnxruntime"} <= failed
    message = report.failure_message()
    assert "torchscript / golden / logits: max abs err" in message
    assert "onnxruntime /" in message


def test_altered_onnx_weights_fail_verify(exported: ExportResult, tmp_path: Path) -> None:
    export_dir = _copy_export(exported, tmp_path)
    onnx_path = export_dir / "model.onnx"
    model = onnx.load(str(onnx_path))
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    weights = numpy_helper.to_array(init).copy()
    weights.flat[:: max(1, weights.size // 50)] += 0.5
    init.CopyFrom(numpy_helper.from_array(weights, init.name))
    onnx.save(model, str(onnx_path))

    # A file changed behind the manifest's back is refused outright...
    with pytest.raises(ArtifactError, match=r"model\.onnx was modified after export"):
        verify(VerifyConfig(export_dir=export_dir, report=tmp_path / "p.json"))

    # ...and one whose manifest was updated too (a broken exporter) fails parity.
    manifest = json.loads((export_dir / MANIFEST_NAME).read_text())
    manifest["artifacts"]["onnx"]["sha256"] = sha256_file(onnx_path)
    write_json(export_dir / MANIFEST_NAME, manifest)
    report = verify(VerifyConfig(export_dir=export_dir, report=tmp_path / "p.json"))
    assert not report.passed
    assert {r.backend for r in report.failures} == {"onnxruntime"}
    assert len(report.failures) == sum(r.backend == "onnxruntime" for r in report.rows)


def test_tighter_tolerance_can_fail_and_lists_every_failure(
    exported: ExportResult, tmp_path: Path
) -> None:
    report = verify(
        VerifyConfig(export_dir=exported.out_dir, atol=0.0, rtol=0.0, report=tmp_path / "p.json")
    )
    onnx_rows = [r for r in report.rows if r.backend == "onnxruntime"]
    assert not report.passed
    assert all(not r.passed for r in onnx_rows if r.max_abs > 0)
    assert report.failure_message().count("\n  - ") == len(report.failures)


def test_interrupted_export_keeps_previous_artifacts(
    trained: TrainResult, exported: ExportResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export_dir = _copy_export(exported, tmp_path)
    before = {p.name: sha256_file(p) for p in export_dir.iterdir()}

    def fail(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-export

    monkeypatch.setattr("pipeline.formats.onnx.to_onnx", fail)
    with pytest.raises(KeyboardInterrupt):
        export(ExportConfig(checkpoint=trained.checkpoint.path, out_dir=export_dir))
    assert {p.name: sha256_file(p) for p in export_dir.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_refuses_checkpoint_of_another_shape(trained: TrainResult, tmp_path: Path) -> None:
    from pipeline.core.checkpoint import save_checkpoint

    bad = save_checkpoint(
        tmp_path / "c.pt",
        {"features.0.weight": torch.zeros(1)},
        {"model": {"name": "digits_lenet", "kwargs": {}}},
    )
    with pytest.raises(CheckpointError, match="does not fit model 'digits_lenet'"):
        export(ExportConfig(checkpoint=bad.path, out_dir=tmp_path / "export"))
    assert not (tmp_path / "export").exists()


def test_verify_without_export_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"No export found.*pipeline export"):
        verify(VerifyConfig(export_dir=tmp_path / "nothing"))
