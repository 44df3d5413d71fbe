"""An export interrupted part-way leaves the previous export exactly as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import pipeline.formats.onnx as onnx_format
from pipeline.core.fileio import staging_dir
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


def test_an_export_killed_mid_way_has_its_folders_swept_by_the_next(tmp_path: Path) -> None:
    """SIGKILL (or a timeout's default SIGTERM) runs no cleanup: the staging, scratch and
    pending-checkpoint folders stayed, hidden, one set per killed export, a compiled .pt2
    included. The next export removes those whose process is gone, and only those."""
    out_dir, ckpt = tmp_path / "export", tmp_path / "ckpt" / "checkpoint.pt"
    argv = ["--model", "digits_mlp", "--random-init", "--checkpoint", str(ckpt)]
    # .pt2 compiles for seconds: the export is surely mid-way when its folders are seen.
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "export",
            *argv,
            "--out-dir",
            str(out_dir),
            "--format",
            "pt2",
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            hidden = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
            if any(".export-scratch-" in n for n in hidden):  # staging and scratch both made
                break
            time.sleep(0.05)
        assert child.poll() is None, "the export ended before it could be killed"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert any(".export.staging-" in n for n in left), left  # what a kill leaves
    assert any(".checkpoint-pending-" in n for p in [ckpt.parent] for n in os.listdir(p))
    mine = staging_dir(".export.staging-", tmp_path)  # a live process's: kept
    export(
        ExportConfig(
            model="digits_mlp",
            random_init=True,
            checkpoint=ckpt,
            out_dir=out_dir,
            formats=("onnx",),
        )
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [mine.name]
    assert [n for n in os.listdir(ckpt.parent) if n.startswith(".")] == []
    assert (out_dir / "model.onnx").is_file()


def test_a_model_with_nothing_to_train_exports_without_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: the models with nothing to train export from their seeded initial weights.
    `pipeline export --model lstm_tagger` said the checkpoint does not exist instead."""
    from pipeline.core.checkpoint import load_checkpoint

    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    ckpt = tmp_path / "artifacts" / "my_decision_gate" / "checkpoint.pt"  # the default one
    result = export(
        ExportConfig(model="my_decision_gate", out_dir=tmp_path / "export", formats=("onnx",))
    )
    assert (result.out_dir / "model.onnx").is_file()
    assert load_checkpoint(ckpt).meta["init"] == "random"  # what `train` would have written


def test_a_mistyped_checkpoint_is_still_an_error_not_random_weights(tmp_path: Path) -> None:
    from pipeline.core.errors import CheckpointError

    typo = tmp_path / "typo" / "checkpont.pt"
    with pytest.raises(CheckpointError, match="does not exist"):
        export(ExportConfig(model="lstm_tagger", checkpoint=typo, out_dir=tmp_path / "e",
                            formats=("onnx",)))  # fmt: skip
    assert not typo.exists()


def test_the_cli_exports_a_model_with_nothing_to_train_without_a_checkpoint() -> None:
    # The CLI always filled in the default checkpoint path, which the seeded export took
    # for a --checkpoint given: `pipeline export --model my_decision_gate` said the
    # checkpoint does not exist, as before the fix above.
    from pipeline.cli import build_parser

    args = build_parser().parse_args(["export", "--model", "my_decision_gate"])
    assert ExportConfig.from_args(args).checkpoint_default
    args = build_parser().parse_args(["export", "--model", "x", "--checkpoint", "c.pt"])
    assert not ExportConfig.from_args(args).checkpoint_default


def test_weights_made_for_another_folder_do_not_replace_the_default_exports_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`export --out-dir X --random-init` (or --weights) wrote <model>/checkpoint.pt, the
    checkpoint <model>/export was made from, and that export's verify then failed."""
    from pipeline.core.errors import ExportError

    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    model = "gru_encoder"  # nothing to train, and weights a seed changes
    default = ExportConfig(model=model, formats=("torchscript",), checkpoint_default=True)
    first = export(default)
    ckpt = tmp_path / "artifacts" / model / "checkpoint.pt"
    kept = ckpt.read_bytes()
    elsewhere = tmp_path / "x" / "export"
    with pytest.raises(ExportError, match=f"This would replace {ckpt}, the checkpoint"):
        export(replace(default, out_dir=elsewhere, random_init=True, seed=3))
    assert ckpt.read_bytes() == kept and not elsewhere.exists()
    own = tmp_path / "x" / "checkpoint.pt"
    export(replace(default, out_dir=elsewhere, random_init=True, seed=3, checkpoint=own))
    assert ckpt.read_bytes() == kept and own.is_file()
    export(replace(default, random_init=True, seed=3))  # into the default folder: replaced
    assert ckpt.read_bytes() != kept and first.out_dir.is_dir()
