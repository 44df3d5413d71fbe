"""What `pipeline train` refuses before its first epoch (a user's trial, 2026-11-29): an --out
its companion files overwrite, an unwritable folder, a checkpoint another run is writing,
a resume with another --clip-grad-norm, ranks started with other settings."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.core.checkpoint import read_sidecar
from pipeline.core.errors import PipelineError
from pipeline.train import TrainConfig, train


def _config(out: Path, **changes: object) -> TrainConfig:
    """digits_mlp (the fastest built-in model) for one epoch, quietly, on CPU."""
    settings: dict = {"model": "digits_mlp", "out": out, "epochs": 1, "progress": False,
                      "report": False, "device": "cpu", **changes}  # fmt: skip
    return TrainConfig(**settings)


@pytest.mark.parametrize(
    ("name", "companion"), [("ck.png", "loss plot"), ("ck.json", "JSON sidecar")]
)
def test_an_out_a_companion_file_would_overwrite_is_refused(
    tmp_path: Path, name: str, companion: str
) -> None:
    """`--out o/ck.png` exited 0 with the plot in place of the weights (`o/ck.json`: the
    sidecar), and export then blamed a changed file."""
    out = tmp_path / "o" / name
    with pytest.raises(
        PipelineError, match=rf"would be overwritten by the run's {companion}.*\.pt"
    ):
        train(_config(out, report=True))
    assert not out.exists()


def test_an_artifacts_folder_that_is_a_file_is_refused_before_training(tmp_path: Path) -> None:
    """It was a NotADirectoryError traceback, after the first epoch."""
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "digits_mlp" / "checkpoint.pt"
    with pytest.raises(PipelineError, match=r"Cannot write the checkpoint's folder .*afile"):
        train(_config(out))


def test_a_checkpoint_another_run_is_writing_is_refused(tmp_path: Path) -> None:
    """Two runs writing one folder at once both reported their own sha256."""
    out = tmp_path / "checkpoint.pt"
    with (tmp_path / ".checkpoint.pt.lock").open("w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        with pytest.raises(PipelineError, match=r"Another `pipeline train` \(process 4242\)"):
            train(_config(out))
    assert not out.exists()
    # Released with the other run: this one trains now, and lets go when it ends.
    assert train(_config(out)).checkpoint.path == out
    assert train(_config(out, resume=True)).checkpoint.path == out


def test_resume_with_another_clip_grad_norm_is_refused(tmp_path: Path) -> None:
    """The resume was accepted, and the sidecar then said clip_grad_norm null for a run
    whose first epochs were clipped."""
    out = tmp_path / "checkpoint.pt"
    train(_config(out, epochs=2, stop_after_epoch=1, clip_grad_norm=0.01))
    with pytest.raises(PipelineError, match=r"clip_grad_norm: 0\.01 then, None now"):
        train(_config(out, epochs=2, resume=True))
    done = train(_config(out, epochs=2, resume=True, clip_grad_norm=0.01))
    assert done.checkpoint.meta["train_config"]["clip_grad_norm"] == 0.01


def test_a_state_from_before_clip_grad_norm_was_recorded_resumes_with_it(tmp_path: Path) -> None:
    """Such a state does not say whether the run clipped: taking the default (None) for it
    refused the very flag the run started with ("None then, 1.0 now")."""
    from pipeline.train import state as train_state

    out = tmp_path / "checkpoint.pt"
    train(_config(out, epochs=2, stop_after_epoch=1, clip_grad_norm=1.0))
    path = train_state.state_path(out)
    older = train_state.load_state(path)
    del older["config"]["clip_grad_norm"]  # as a state written before it joined the key
    train_state.save_state(path, older)
    done = train(_config(out, epochs=2, resume=True, clip_grad_norm=1.0))
    assert done.checkpoint.meta["train_config"]["clip_grad_norm"] == 1.0


def test_the_thread_count_is_recorded_and_a_resume_under_another_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes repeat only at one intra-op thread count (torchrun sets OMP_NUM_THREADS=1)."""
    out = tmp_path / "checkpoint.pt"
    threads = torch.get_num_threads()
    train(_config(out, epochs=2, stop_after_epoch=1))
    assert read_sidecar(out)["intra_op_threads"] == threads
    capsys.readouterr()
    torch.set_num_threads(threads + 1)
    try:
        train(_config(out, epochs=2, resume=True))
    finally:
        torch.set_num_threads(threads)
    said = capsys.readouterr().out
    assert f"started with {threads} intra-op threads and resumes with {threads + 1}" in said


def test_when_n_processes_see_what_one_process_sees() -> None:
    from pipeline.train.guard import equivalence_note

    assert equivalence_note(1436, 64, 2) is None
    assert equivalence_note(1436, 64, 1) is None
    assert "dropped" in (equivalence_note(1436, 6, 2) or "")  # 1436 % 6 == 2 == N
    assert "repeats a few samples" in (equivalence_note(1436, 64, 3) or "")


def _two_ranks(tmp_path: Path, *per_rank: list[str]) -> list[tuple[int, str]]:
    """`pipeline train` as ranks 0 and 1 of one gloo group on this host (each with its own
    artifacts folder, as two machines), digits_mlp for an epoch: (exit status, output)."""
    from pipeline.serving.launcher import free_port

    port = free_port()
    procs = []
    for rank, extra in enumerate(per_rank):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore"}  # fmt: skip
        cmd = [sys.executable, "-m", "pipeline", "--artifacts-dir", str(tmp_path / f"r{rank}"),
               "train", "--model", "digits_mlp", "--epochs", "1", "--device", "cpu",
               "--no-progress", "--no-report", *extra]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [(proc.returncode, said) for proc, said in zip(procs, outputs, strict=True)]


def test_ranks_started_with_other_settings_all_refuse_before_training(tmp_path: Path) -> None:
    """Two launchers with another --lr trained silently with rank 0's; another --epochs
    gave rank 0 a "successful" checkpoint and the peer a gloo error."""
    ranks = _two_ranks(tmp_path, ["--lr", "0.003"], ["--lr", "0.05"])
    for returncode, said in ranks:
        assert returncode == 1, said
        assert "started with different settings (lr: 0.003 on rank 0, 0.05 on rank 1)" in said
    assert not list(tmp_path.rglob("checkpoint.pt"))


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--out", "ck.png"], "--out ck.png would be overwritten by the run's loss plot"),
        (["--model", "nosuch"], "Unknown model 'nosuch'"),
    ],
)
def test_one_ranks_refused_arguments_stop_every_rank_at_once(
    tmp_path: Path, extra: list[str], said: str
) -> None:
    """A rank that refused its own arguments (another launcher's --out, a model name only
    its machine lacks) raised before the process group was up: its launcher ended, and the
    other machine's ranks waited in the group's rendezvous for 30 minutes, printing nothing."""
    (zero, said0), (one, said1) = _two_ranks(tmp_path, [], extra)
    assert one == 1 and said in said1 and "stopped the run" not in said1, said1
    assert zero == 1 and f"rank 1 stopped the run: {said}" in said0, said0
    assert not list(tmp_path.rglob("checkpoint.pt"))


def test_under_ddp_the_writing_rank_takes_the_lock_and_every_rank_stops(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "r0" / "digits_mlp"
    folder.mkdir(parents=True)
    with (folder / ".checkpoint.pt.lock").open("w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        (zero, said0), (one, said1) = _two_ranks(tmp_path, [], [])
    assert zero == 1 and "Another `pipeline train` (process 4242)" in said0, said0
    assert one == 1 and "rank 0 stopped the run: Another `pipeline train`" in said1, said1
    assert not list(tmp_path.rglob("checkpoint.pt"))


def test_an_unknown_model_is_not_offered_what_train_refuses() -> None:
    # train said "your own model can be given as path/to/file.py:ClassName", which it
    # then refuses (`pipeline train` has no task for it).
    from pipeline.core.errors import UnknownModelError
    from pipeline.train import entry_for
    from pipeline.train.config import TrainConfig

    with pytest.raises(UnknownModelError) as err:
        entry_for(TrainConfig(model="nosuch"))
    said = str(err.value)
    assert "Known models: digits_lenet" in said and "file.py:ClassName" not in said, said
    assert "pipeline export --weights FILE" in said, said
