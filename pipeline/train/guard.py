"""Checks a training run passes before its first epoch: files it writes, who writes them.

Each failure found here used to surface only after an epoch had been spent, or not at all:
an --out whose plot or sidecar was the checkpoint itself, two runs writing one checkpoint,
an artifacts folder that cannot be written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

from pipeline.core.checkpoint import sidecar_path
from pipeline.core.errors import PipelineError
from pipeline.train import distributed
from pipeline.train import state as train_state
from pipeline.train.config import TrainConfig
from pipeline.zoo.spec import ZooEntry


def companions(out: Path) -> dict[str, Path]:
    """Every file a run writes besides the checkpoint `out`, by what it is."""
    return {
        "JSON sidecar": sidecar_path(out),
        "resume state": train_state.state_path(out),
        "model summary": out.with_suffix(".summary.txt"),
        "loss plot": out.with_suffix(".png"),
        "lock file": lock_path(out),
    }


def lock_path(out: Path) -> Path:
    # Its own name plus a suffix (not with_suffix): it can never be the checkpoint itself.
    return out.with_name(f".{out.name}.lock")


def check_out(out: Path) -> None:
    """Refuse an --out that one of its companion files would overwrite (`o/ck.png` is also
    the plot's name, `o/ck.json` the sidecar's): the run ended "successfully" with the
    checkpoint replaced, and export then blamed a changed file."""
    clashes = [what for what, path in companions(out).items() if _same(path, out)]
    if clashes:
        raise PipelineError(
            f"--out {out} would be overwritten by the run's {' and '.join(clashes)}, which "
            f"is named after it. Give the checkpoint a .pt name, e.g. --out {out.with_suffix('.pt')}."
        )


def _same(a: Path, b: Path) -> bool:
    return a == b or a.resolve() == b.resolve()


class OutputLock:
    """An exclusive, non-blocking flock on a file beside the checkpoint, held for a whole
    run, so a second run writing the same checkpoint fails at once instead of both
    reporting a sha256 that only one of them left in the file."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = lock_path(out)
        self._fd: int | None = None

    def acquire(self) -> None:
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise PipelineError(
                f"Cannot write the checkpoint's folder {folder} ({err.strerror or err}). "
                "Give --artifacts-dir (or --out) a folder you can create and write."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise PipelineError(
                f"Another `pipeline train` ({who}) is writing {self.out} right now (it holds "
                f"{self.path}). Wait for it to finish, or give this run another "
                "--out or --artifacts-dir."
            ) from None
        # Recorded for the message above; the lock itself, not the pid, is what excludes.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            # The file stays: removing it would let a third run lock a new inode while a
            # second still waits on the old one.
            os.ftruncate(self._fd, 0)
            # Unlocked, not only closed: a forked DataLoader worker still alive holds a copy
            # of the descriptor, and the flock stays while any copy is open (the next run
            # in this process was refused as "another process").
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    return None


def equivalence_note(samples: int, batch_size: int, processes: int) -> str | None:
    """Why N processes would not see the samples one process sees, or None when they do:
    DistributedSampler pads an uneven split with repeated samples, and the last batch is
    dropped when it would be a single sample (BatchNorm), which with a remainder of N
    happens on N processes but not on one."""
    if processes == 1:
        return None
    if samples % processes:
        return (
            f"{samples} training samples do not split evenly over {processes} processes: each "
            "epoch repeats a few samples to pad the split, so this run differs from a "
            "one-process run."
        )
    if samples % batch_size == processes:
        return (
            f"the last batch of each epoch ({processes} samples, one per process) is dropped "
            "here but kept by a one-process run, so the two differ; another --batch-size "
            "avoids it."
        )
    return None


def agreed_settings(
    config: TrainConfig, entry: ZooEntry, world: distributed.World
) -> dict[str, Any]:
    """What every rank of one run must have been started with."""
    return {
        "model": entry.name,
        **resume_key(config, world),
        "resume": config.resume,
        "stop_after_epoch": config.stop_after_epoch,
    }


def resume_key(config: TrainConfig, world: distributed.World) -> dict[str, Any]:
    """Settings a resumed run must share with the run it continues."""
    return {
        "seed": config.seed,
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "amp": config.amp,
        "clip_grad_norm": config.clip_grad_norm,
        "weight_decay": config.weight_decay,
        "world_size": world.size,
    }
