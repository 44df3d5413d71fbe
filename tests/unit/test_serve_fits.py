"""serve's word on a model whose one sample cannot fit under --max-request-size: a
ResNet-50 detector's 800×800 image is 7.7 MB even as binary, over the 4 MiB default, and
every request got a 413 while serve said nothing (a user's trial)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.manifest import read_manifest
from pipeline.serving.fits import oversize_lines, sample_bytes
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.server import Server
from pipeline_runtime.manifest import (
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    TensorRecord,
    Tolerance,
)


def _export(folder: Path, shape: tuple, fixed: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    details = {"fixed_axes": fixed} if fixed else {}
    manifest = Manifest(
        model=ModelRecord("det"),
        inputs=(TensorRecord("images", shape, "float32"),),
        outputs=(TensorRecord("boxes", ("n", 4), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("../checkpoint.pt", "0" * 64),
        artifacts={"onnx": ArtifactRecord("model.onnx", "dynamo", "0" * 64, details=details)},
    )
    (folder / "manifest.json").write_text(manifest.dumps())
    return folder


def test_a_fixed_sample_over_the_limit_is_said_and_a_dynamic_one_is_not(tmp_path: Path) -> None:
    big = _export(tmp_path / "big", ("batch", 3, 800, 800))
    free = _export(tmp_path / "free", ("batch", 3, "h", "w"))
    fixed = _export(tmp_path / "fixed", ("batch", 3, "h", "w"), {"h": 800, "w": 800})
    assert sample_bytes(read_manifest(big), "onnx") == 3 * 800 * 800 * 4
    assert sample_bytes(read_manifest(free), "onnx") is None  # the client picks the size
    fixed_size = sample_bytes(read_manifest(fixed), "onnx")
    assert fixed_size == 3 * 800 * 800 * 4  # --fix-axis made it fixed
    folders = {"big": big, "free": free, "fixed": fixed}
    server = Server(
        runtime="kserve", pid=0, run_dir=str(tmp_path), inference_url="", metrics_url="",
        models=list(folders),
        served={m: ServedInfo(m, "onnx") for m in folders},
    )  # fmt: skip
    lines = oversize_lines(server, 4 * 1024 * 1024, lambda m: read_manifest(folders[m]))
    assert [line.split(" is ")[0] for line in lines] == [
        "warning: one sample of big",
        "warning: one sample of fixed",
    ]
    assert "7,680,000 bytes even as binary (.npy), over --max-request-size 4,194,304" in lines[0]
    assert lines[0].endswith("Serve with --max-request-size 15728640 or more.")
    assert oversize_lines(server, 64 * 1024 * 1024, lambda m: read_manifest(folders[m])) == []
