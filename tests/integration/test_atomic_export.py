"""An export interrupted part-way leaves the previous export exactly as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

import pipeline.formats.onnx as onnx_format
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.train import TrainResult
from pipeline.verify import VerifyConfig, verify


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_export_keeps_the_previous_one(
    trained: TrainResult,
    exported: ExportResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    interruption: type[BaseException],
) -> None:
    out_dir = tmp_path / "export"
    shutil.copytree(exported.out_dir, out_dir)
    before = _digests(out_dir)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise interruption("interrupted while writing the ONNX file")

    # After TorchScript was written to the staging folder, before ONNX: mid-export.
    monkeypatch.setattr(onnx_format, "to_onnx", interrupted)
    with pytest.raises(interruption):
        export(ExportConfig(checkpoint=trained.checkpoint.path, out_dir=out_dir))
    assert _digests(out_dir) == before  # every previous file, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging left behind

    monkeypatch.undo()
    result = export(ExportConfig(checkpoint=trained.checkpoint.path, out_dir=out_dir))
    assert result.out_dir == out_dir
    report = verify(
        VerifyConfig(
            export_dir=out_dir,
            backends=("torchscript", "onnxruntime"),
            report=tmp_path / "parity.json",
        )
    )
    assert report.passed, report.failure_message()
    # No staging folder left: the export and verify's reports (JSON, Markdown, histograms).
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "export",
        "parity.json",
        "parity.md",
        "parity_files",
    ]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, OSError])
def test_an_export_interrupted_while_swapping_in_keeps_the_previous_one(
    trained: TrainResult,
    exported: ExportResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    interruption: type[BaseException],
) -> None:
    """The last step renames the old export aside, then the new one into place.

    An interruption between the two renames (Ctrl-C, or the second rename
    failing) must put the old export back, not leave no export at all.
    """
    out_dir = tmp_path / "export"
    shutil.copytree(exported.out_dir, out_dir)
    before = _digests(out_dir)
    real_rename = Path.rename

    def rename(self: Path, target: str | Path) -> Path:
        if self.name.startswith(f".{out_dir.name}.staging-"):  # the new export, complete
            assert not out_dir.exists()  # the old one is already set aside
            raise interruption("interrupted between the two renames")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(interruption):
        export(ExportConfig(checkpoint=trained.checkpoint.path, out_dir=out_dir))
    monkeypatch.undo()
    assert _digests(out_dir) == before  # every previous file, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging, no .old

    result = export(ExportConfig(checkpoint=trained.checkpoint.path, out_dir=out_dir))
    assert result.out_dir == out_dir
    # Re-exported in the default formats: the same files, less the fixture's .pt2 and .pte.
    assert _digests(out_dir).keys() == before.keys() - {"model.pt2", "model.pte"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
