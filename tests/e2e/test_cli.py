"""The `pipeline` command as a user runs it: help, the happy path, every error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.core.checkpoint import sidecar_path
from pipeline.core.fileio import sha256_file
from pipeline.export import ExportResult
from pipeline.train import TrainResult
from tests.conftest import assert_clean_error, run_cli

run = run_cli


def test_help_lists_every_stage() -> None:
    proc = run("--help")
    assert proc.returncode == 0
    for stage in ("train", "export", "verify", "models"):
        assert stage in proc.stdout
    script = Path(sys.executable).parent / "pipeline"  # the console script beside python
    console = subprocess.run([script, "--help"], capture_output=True, text=True, check=False)
    assert console.returncode == 0 and console.stdout == proc.stdout


@pytest.mark.parametrize("stage", ["train", "export", "verify", "models"])
def test_every_stage_has_help(stage: str) -> None:
    proc = run(stage, "--help")
    assert proc.returncode == 0 and "usage: pipeline " + stage in proc.stdout


def test_unknown_model(tmp_path: Path) -> None:
    assert_clean_error(
        run("--artifacts-dir", tmp_path, "export", "--model", "nope"),
        "Unknown model 'nope'",
        "digits_lenet",
    )
    assert_clean_error(
        run("--artifacts-dir", tmp_path, "train", "--model", "nope"), "Unknown model 'nope'"
    )


def test_missing_checkpoint(tmp_path: Path) -> None:
    proc = run("--artifacts-dir", tmp_path, "export")
    assert_clean_error(
        proc, str(tmp_path / "digits_lenet" / "checkpoint.pt"), "does not exist", "pipeline train"
    )


def _copy_checkpoint(trained: TrainResult, tmp_path: Path) -> Path:
    return _place_checkpoint(trained.checkpoint.path, tmp_path / "checkpoint.pt")


def _place_checkpoint(source: Path, dst: Path) -> Path:
    """A session checkpoint (and its sidecar) where a user's `pipeline train` leaves one."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(source.read_bytes())
    sidecar_path(dst).write_bytes(sidecar_path(source).read_bytes())
    return dst


def _trained_by_the_session(family: dict[str, ExportResult], art: Path, model: str) -> None:
    """`pipeline train --model MODEL` as the session's family fixture already ran it
    (test_training_modes trains every model through the CLI): no second training."""
    exported = family[model]
    source = (exported.out_dir / exported.manifest.checkpoint.path).resolve()
    _place_checkpoint(source, art / model / "checkpoint.pt")


def test_checkpoint_with_wrong_sha256(trained: TrainResult, tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(trained, tmp_path)
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0x01
    ckpt.write_bytes(bytes(data))
    proc = run("export", "--checkpoint", ckpt, "--out-dir", tmp_path / "out")
    assert_clean_error(proc, str(ckpt), "sha256", "changed or truncated")
    assert not (tmp_path / "out").exists()


def _with_matching_sidecar(trained: TrainResult, path: Path) -> None:
    meta = json.loads(sidecar_path(trained.checkpoint.path).read_text())
    meta["weights_sha256"] = sha256_file(path)
    sidecar_path(path).write_text(json.dumps(meta))


def test_file_that_is_not_a_checkpoint(trained: TrainResult, tmp_path: Path) -> None:
    path = tmp_path / "readme.pt"
    path.write_text("these are not the weights you are looking for\n")
    _with_matching_sidecar(trained, path)
    assert_clean_error(run("export", "--checkpoint", path), str(path), "not a PyTorch checkpoint")
    # Without a sidecar it is refused before anything is read.
    other = tmp_path / "other.pt"
    other.write_bytes(os.urandom(512))
    assert_clean_error(run("export", "--checkpoint", other), "metadata file", "is missing")


class Payload:
    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/nonexistent")


def test_checkpoint_with_pickled_objects(trained: TrainResult, tmp_path: Path) -> None:
    global MARKER
    MARKER = tmp_path / "code-ran"
    state = dict(torch.load(trained.checkpoint.path, weights_only=True))
    state["extra"] = Payload()
    path = tmp_path / "poisoned.pt"
    torch.save(state, path)
    _with_matching_sidecar(trained, path)
    proc = run("export", "--checkpoint", path, "--out-dir", tmp_path / "out")
    assert_clean_error(proc, str(path), "pickled objects beyond tensors", "was not unpickled")
    assert not MARKER.exists()


def test_method_trace_on_the_gate_fails_naming_the_branch_line(
    family: dict[str, ExportResult], tmp_path: Path
) -> None:
    art = tmp_path / "art"
    _trained_by_the_session(family, art, "my_decision_gate")
    proc = run("--artifacts-dir", art, "export", "--model", "my_decision_gate", "--method", "trace")
    assert_clean_error(
        proc, "--method trace refused", "rnn.py:", "if x.sum() > 0", "--allow-unsafe-trace"
    )
    assert not (art / "my_decision_gate" / "export").exists()

    # TorchScript alone: what --method chooses for (ONNX would add an export and its verify).
    proc = run(
        "--artifacts-dir",
        art,
        "export",
        "--model",
        "my_decision_gate",
        "--method",
        "trace",
        "--allow-unsafe-trace",
        "--format",
        "torchscript",
    )
    assert proc.returncode == 0, proc.stderr
    proc = run("--artifacts-dir", art, "verify", "--model", "my_decision_gate")
    assert_clean_error(
        proc, "Parity FAILED for my_decision_gate", "torchscript / probe sum", "max rel err 2"
    )


def test_auto_export_of_a_trained_rnn_scripts_it(
    family: dict[str, ExportResult], tmp_path: Path
) -> None:
    art = tmp_path / "art"
    _trained_by_the_session(family, art, "wrap_rnn")
    # TorchScript alone: the format whose method auto picks (the session's family fixture
    # exports and verifies wrap_rnn's other formats).
    proc = run("--artifacts-dir", art, "export", "--model", "wrap_rnn", "--format", "torchscript")
    assert proc.returncode == 0, proc.stderr
    assert "script: trace rejected" in proc.stdout
    proc = run("--artifacts-dir", art, "verify", "--model", "wrap_rnn")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "seq=13" in proc.stdout
