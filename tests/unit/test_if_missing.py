"""`export --if-missing` settles an export only if it was made with the asked settings
(pipeline/export/partial.py:settled). It compared the weights alone: a `.pte` fixed to
seq=16 was kept when a dynamic one was asked for, and the `--fix-axis` a partial export
advised got "nothing to do" (a user's trial of the on-device format, 2026-11-29)."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.core.checkpoint import read_sidecar
from pipeline.export.partial import settled
from pipeline.train import TrainConfig, train
from pipeline.zoo.spec import TensorSpec
from pipeline_runtime.manifest import (
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    TensorRecord,
    Tolerance,
)

X = TensorRecord("x", ("batch", "seq", 4), "float32")


def _export(tmp_path: Path, pte: dict, failed: dict | None = None) -> tuple[Path, Path]:
    checkpoint = tmp_path / "ck.pt"
    if not checkpoint.exists():  # my_cell (20 weights) trains in a second or two
        train(TrainConfig(model="my_cell", out=checkpoint, progress=False, report=False))
    out = tmp_path / "export"
    out.mkdir(exist_ok=True)
    artifacts = {"pte": ArtifactRecord("model.pte", "executorch", "0" * 64, details=pte)}
    onnx = ArtifactRecord("model.onnx", "dynamo", "1" * 64, details={"opset": 18})
    manifest = Manifest(
        model=ModelRecord("my_cell"),
        inputs=(X,),
        outputs=(TensorRecord("y", ("batch", 4), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("../ck.pt", read_sidecar(checkpoint)["weights_sha256"]),
        artifacts={**artifacts, "onnx": onnx} if failed is None else artifacts,
        created="2026-11-29T00:00:00+00:00",
        failed=failed or {},
    )
    (out / "manifest.json").write_text(manifest.dumps())
    return out, checkpoint


def test_an_export_fixed_at_other_sizes_is_not_settled(tmp_path: Path) -> None:
    out, ck = _export(tmp_path, {"fixed_axes": {"seq": 16}})
    assert settled(out, "my_cell", ("pte",), ck, fix_axes={"seq": 16}) is not None
    assert settled(out, "my_cell", ("pte",), ck, fix_axes={}) is None  # a dynamic one asked
    assert settled(out, "my_cell", ("pte",), ck, fix_axes={"seq": 32}) is None
    assert settled(out, "my_cell", ("onnx",), ck, opset=18) is not None
    assert settled(out, "my_cell", ("onnx",), ck, opset=20) is None


def test_a_recorded_failure_is_tried_again_with_the_fix_axis_it_advised(tmp_path: Path) -> None:
    out, ck = _export(tmp_path, {}, failed={"pt2": "a loop over a dynamic seq"})
    assert settled(out, "my_cell", ("pt2",), ck) is not None  # not retried as it was
    assert settled(out, "my_cell", ("pt2",), ck, fix_axes={"seq": 16}) is None


def test_other_declared_inputs_are_not_settled(tmp_path: Path) -> None:
    out, ck = _export(tmp_path, {})
    same = [TensorSpec("x", ("batch", "seq", 4), torch.float32)]
    assert settled(out, "my_cell", ("pte",), ck, inputs=same) is not None
    other = [TensorSpec("x", ("batch", "seq", 8), torch.float32)]
    assert settled(out, "my_cell", ("pte",), ck, inputs=other) is None


def test_fix_axis_is_compared_only_where_it_applies(tmp_path: Path) -> None:
    # A review: the ONNX trace of a detector records its own fixed axes, and TorchScript
    # none, so comparing every format's re-exported them on every --if-missing.
    out, ck = _export(tmp_path, {"fixed_axes": {"seq": 16}})
    manifest = out / "manifest.json"
    text = manifest.read_text().replace('"opset": 18', '"opset": 18, "fixed_axes": {"batch": 1}')
    manifest.write_text(text)
    assert settled(out, "my_cell", ("onnx",), ck) is not None  # its own fixed batch
    assert settled(out, "my_cell", ("onnx", "pte"), ck, fix_axes={"seq": 16}) is not None
