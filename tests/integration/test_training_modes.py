"""Training at scale: DDP over torchrun, mixed precision, resume, reports."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from PIL import Image

from pipeline.core.checkpoint import load_checkpoint
from pipeline.train import TrainConfig, TrainResult, train

TRAINABLE = ["digits_lenet", "digits_mlp", "my_cell", "my_rnn_loop", "wrap_rnn"]


def torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    torchrun_exe = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun_exe), "--standalone", "--nproc-per-node", "2", "-m", "pipeline", *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)


# The digits MLP over two processes, as both DDP tests below run it.
DDP_MLP = ["train", "--model", "digits_mlp", "--epochs", "2", "--batch-size", "64",
           "--no-progress", "--no-report"]  # fmt: skip


@dataclass(frozen=True)
class DdpRun:
    proc: subprocess.CompletedProcess[str]
    checkpoint: Path


@pytest.fixture(scope="module")
def ddp_mlp(tmp_path_factory: pytest.TempPathFactory) -> DdpRun:
    """One uninterrupted two-process run of DDP_MLP: what the single-process run and the
    stopped-and-resumed run are each compared with (one torchrun start, not two)."""
    tmp = tmp_path_factory.mktemp("ddp_mlp")
    proc = torchrun(tmp, "--artifacts-dir", str(tmp / "ddp"), *DDP_MLP)
    return DdpRun(proc, tmp / "ddp" / "digits_mlp" / "checkpoint.pt")


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The default digits run, two epochs, two DataLoader workers, report on: the
    uninterrupted run the stopped-and-resumed one is compared with, and the run whose
    summary and plot are checked (one training for both, not two)."""
    out = tmp_path_factory.mktemp("two_epochs") / "whole" / "checkpoint.pt"
    return train(TrainConfig(out=out, epochs=2, workers=2, progress=False, device="cpu"))


def test_two_process_ddp_matches_one_process_over_the_same_global_batch(
    ddp_mlp: DdpRun, tmp_path: Path
) -> None:
    proc = ddp_mlp.proc
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("checkpoint:") == 1  # only rank 0 reports and writes
    ddp = load_checkpoint(ddp_mlp.checkpoint)
    assert ddp.meta["world_size"] == 2
    single = train(
        TrainConfig(model="digits_mlp", out=tmp_path / "single" / "checkpoint.pt", epochs=2,
                    batch_size=64, progress=False, report=False, device="cpu")
    )  # fmt: skip
    for name, tensor in single.checkpoint.state_dict.items():
        torch.testing.assert_close(ddp.state_dict[name], tensor, atol=1e-6, rtol=0)
    # Metrics are reduced over both ranks: the same as one process sees.
    for a, b in zip(ddp.meta["metrics"]["history"], single.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1e-9)


@pytest.fixture(scope="module")
def ddp_amp_all(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Every trainable model with DDP and AMP in one torchrun launch (`--model` repeated:
    one process group for all, joined once), its artifacts folder."""
    tmp = tmp_path_factory.mktemp("ddp_amp")
    models = [a for m in TRAINABLE for a in ("--model", m)]
    proc = torchrun(
        tmp, "--artifacts-dir", str(tmp), "train", *models, "--epochs", "1",
        "--amp", "--clip-grad-norm", "5", "--no-progress", "--no-report",
    )  # fmt: skip
    return proc, tmp


@pytest.mark.parametrize("model", TRAINABLE)
def test_every_trainable_model_trains_with_ddp_and_amp(
    ddp_amp_all: tuple[subprocess.CompletedProcess[str], Path], model: str
) -> None:
    proc, folder = ddp_amp_all
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count(f"model:      {model}\n") == 1  # rank 0 reports each once
    ckpt = load_checkpoint(folder / model / "checkpoint.pt")
    assert ckpt.meta["amp"] is True and ckpt.meta["world_size"] == 2
    assert all(t.dtype == torch.float32 for t in ckpt.state_dict.values() if t.is_floating_point())


def test_several_models_are_checked_before_any_trains(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    unknown = run_cli("--artifacts-dir", tmp_path, "train", "--model", "digits_mlp",
                      "--model", "nope", "--no-progress")  # fmt: skip
    assert unknown.returncode == 1 and "Unknown model 'nope'" in unknown.stderr, unknown.stderr
    assert not (tmp_path / "digits_mlp").exists()  # nothing trained before the error
    out = run_cli("--artifacts-dir", tmp_path, "train", "--model", "digits_mlp",
                  "--model", "my_cell", "--out", tmp_path / "c.pt")  # fmt: skip
    assert out.returncode == 1 and "--out applies to one model" in out.stderr, out.stderr


def test_bf16_amp_on_cpu_loss_falls(tmp_path: Path) -> None:
    result = train(
        TrainConfig(
            out=tmp_path / "c.pt", epochs=4, amp=True, progress=False, report=False, device="cpu"
        )
    )
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < losses[0] / 4
    assert result.history[-1]["val_accuracy"] > 0.9
    assert all(
        t.dtype == torch.float32
        for t in result.checkpoint.state_dict.values()
        if t.is_floating_point()
    )


def test_interrupted_then_resumed_run_ends_with_the_same_weights(
    two_epochs: TrainResult, tmp_path: Path
) -> None:
    """BatchNorm, Dropout, two DataLoader workers: every RNG has to be restored (the
    epoch after the resume differs otherwise, so two epochs, stopped after the first).
    Resuming it with other settings is refused first (and changes nothing)."""
    from pipeline.core.errors import PipelineError

    whole = two_epochs  # the same settings, never stopped
    common = {"epochs": 2, "workers": 2, "progress": False, "device": "cpu"}
    first = train(
        TrainConfig(out=tmp_path / "split" / "checkpoint.pt", stop_after_epoch=1, **common)
    )
    assert not first.completed
    assert first.checkpoint.meta["epoch"] == 1
    with pytest.raises(PipelineError, match=r"other settings \(epochs: 2 then, 3 now\)"):
        train(
            TrainConfig(
                out=tmp_path / "split" / "checkpoint.pt", resume=True, **{**common, "epochs": 3}
            )
        )
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "train", "--out", str(tmp_path / "split" / "checkpoint.pt"),
         "--epochs", "2", "--workers", "2", "--device", "cpu", "--resume", "--no-progress"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming digits_lenet after epoch 1" in proc.stdout + proc.stderr
    resumed = load_checkpoint(tmp_path / "split" / "checkpoint.pt")
    assert resumed.meta["weights_sha256"] == whole.checkpoint.meta["weights_sha256"]
    assert len(resumed.meta["metrics"]["history"]) == 2


def test_resume_without_state_is_a_clear_error(tmp_path: Path) -> None:
    from pipeline.core.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"Cannot resume: .*state\.pt does not exist"):
        train(TrainConfig(out=tmp_path / "c.pt", resume=True, progress=False))


def test_summary_and_plot_are_written(two_epochs: TrainResult) -> None:
    result, folder = two_epochs, two_epochs.checkpoint.path.parent
    assert "Total params" in result.summary
    assert "Conv2d" in (folder / "checkpoint.summary.txt").read_text()
    assert result.plot == folder / "checkpoint.png"
    with Image.open(result.plot) as image:
        assert image.format == "PNG"
        assert image.width > 400


@pytest.mark.gpu
def test_fp16_amp_with_grad_scaler_on_cuda(tmp_path: Path) -> None:
    result = train(
        TrainConfig(
            out=tmp_path / "c.pt", epochs=3, amp=True, progress=False, report=False, device="cuda"
        )
    )
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert all(
        t.dtype == torch.float32
        for t in result.checkpoint.state_dict.values()
        if t.is_floating_point()
    )


def test_ddp_run_stopped_and_resumed_matches_an_uninterrupted_one(
    ddp_mlp: DdpRun, tmp_path: Path
) -> None:
    whole = ddp_mlp.proc  # the same settings, never stopped
    assert whole.returncode == 0, whole.stderr[-2000:]
    first = torchrun(
        tmp_path, "--artifacts-dir", str(tmp_path / "split"), *DDP_MLP, "--stop-after-epoch", "1"
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert "stopped after epoch 1" in first.stdout + first.stderr
    second = torchrun(tmp_path, "--artifacts-dir", str(tmp_path / "split"), *DDP_MLP, "--resume")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming digits_mlp after epoch 1" in second.stdout + second.stderr
    a = load_checkpoint(ddp_mlp.checkpoint)
    b = load_checkpoint(tmp_path / "split" / "digits_mlp" / "checkpoint.pt")
    assert b.meta["world_size"] == 2
    assert a.meta["weights_sha256"] == b.meta["weights_sha256"]
