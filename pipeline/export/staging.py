"""Writing an export folder so readers see the old one or the new one, never half of either."""

from __future__ import annotations

import io
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline_runtime.files import sha256_file
from pipeline_runtime.manifest import WARMUP_FILE, WARMUP_KEY, ArtifactRecord

log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """Fresh, detached copies of every tensor in `value`.

    A tensor that picked up Python attributes on its way through the model is
    pickled with its `__dict__` (a `set` among them), which LibTorch's
    `torch::pickle_load` cannot read; a clone carries only the data.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().clone().contiguous()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value


def save_tensors(target: Path, payload: dict[str, Any]) -> None:
    buffer = io.BytesIO()  # in memory first: see checkpoint.state_dict_bytes
    torch.save(plain(payload), buffer)
    target.write_bytes(buffer.getvalue())


def remove_new(folder: Path, before: set[Path]) -> None:
    """Delete what appeared in `folder` since `before` (a failed format's partial files)."""
    for path in set(folder.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def swap_in(staging: Path, out_dir: Path) -> None:
    """Replace `out_dir` with `staging` so readers see the old export or the new one."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(old)
    try:
        staging.rename(out_dir)
    except BaseException:
        # An error or Ctrl-C between the two renames left no export at all (the old
        # one set aside under a hidden name, the new one deleted by the caller's
        # cleanup): put the old one back. (A SIGKILL here still needs two renames.)
        if old is not None:
            old.rename(out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_warmup(staging: Path, inputs: dict[str, Any], artifacts: dict[str, Any]) -> None:
    """The golden inputs as an .npz for torch-free workers; skipped (they fall back to
    torch) for a dtype numpy has no twin of."""
    try:
        arrays = {k: v.detach().cpu().numpy() for k, v in inputs.items()}
        with (staging / WARMUP_FILE).open("wb") as fh:
            np.savez(fh, **arrays)
    except (TypeError, RuntimeError) as err:  # bfloat16, an input named "file"
        (staging / WARMUP_FILE).unlink(missing_ok=True)
        log.info("no %s for torch-free serving: %s", WARMUP_FILE, err)
        return
    artifacts[WARMUP_KEY] = ArtifactRecord(
        WARMUP_FILE,
        "numpy.savez (the golden inputs)",
        sha256_file(staging / WARMUP_FILE),
        details={"inputs": sorted(arrays)},
    )
