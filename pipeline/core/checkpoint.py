"""The checkpoint contract between training and export (see DESIGN.md).

A checkpoint is two files side by side:

* ``<stem>.pt``: the model's ``state_dict`` written with ``torch.save``; it
  loads with ``torch.load(..., weights_only=True)``.
* ``<stem>.json``: the sidecar: model name and constructor arguments, seed,
  epochs, metrics, torch version and the sha256 of the ``.pt`` file.

Loading checks the sidecar's sha256 *before* unpickling anything, and then
unpickles only with ``weights_only=True``, so a file that would run code is
refused, never executed.
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import CheckpointError
from pipeline.core.fileio import atomic_write, sha256_file, write_json

CHECKPOINT_FORMAT = "pipeline.core.checkpoint/1"
_REQUIRED_KEYS = ("format", "model", "weights_sha256")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def model_name(self) -> str:
        return str(self.meta["model"]["name"])

    @property
    def model_kwargs(self) -> dict[str, Any]:
        return dict(self.meta["model"].get("kwargs", {}))


def sidecar_path(weights: Path) -> Path:
    return Path(weights).with_suffix(".json")


def state_dict_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    """Serialise to memory first: `torch.save` names the zip's top folder after
    the file it writes, so saving straight to a temp file would make the bytes
    (and sha256) depend on a random name."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, buffer)
    return buffer.getvalue()


def save_checkpoint(
    path: Path, state_dict: dict[str, torch.Tensor], meta: dict[str, Any]
) -> Checkpoint:
    """Write weights then sidecar, each atomically. The sidecar goes last: a
    reader that finds it finds complete weights whose sha256 it can check."""
    path = Path(path)
    data = state_dict_bytes(state_dict)
    atomic_write(path, lambda tmp: tmp.write_bytes(data))
    full_meta = {
        **meta,
        "format": CHECKPOINT_FORMAT,
        "weights_file": path.name,
        "weights_sha256": sha256_file(path),
        "torch_version": torch.__version__,
    }
    write_json(sidecar_path(path), full_meta)
    return Checkpoint(path=path, state_dict=state_dict, meta=full_meta)


def _refuse(path: Path, problem: str, advice: str) -> CheckpointError:
    return CheckpointError(f"Cannot use checkpoint {path}: {problem} {advice}")


def read_sidecar(path: Path) -> dict[str, Any]:
    """The checkpoint's metadata, validated; raises `CheckpointError` otherwise."""
    path = Path(path)
    meta_path = sidecar_path(path)
    if not path.is_file():
        raise _refuse(
            path,
            "the file does not exist.",
            "Train one with `pipeline train` (or `make train`); export with --random-init (a "
            "model with nothing to train) or --weights FILE (your own state_dict); or pass "
            "--checkpoint with the path of a .pt file written by `pipeline train`.",
        )
    if not meta_path.is_file():
        raise _refuse(
            path,
            f"its metadata file {meta_path} is missing, so the weights cannot be checked.",
            "Use a checkpoint written by `pipeline train`; it writes both files side by side.",
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _refuse(
            path,
            f"its metadata file {meta_path} is not valid JSON ({err}).",
            "Re-run `pipeline train` to write a fresh checkpoint.",
        ) from None
    missing = [k for k in _REQUIRED_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise _refuse(
            path,
            f"its metadata file {meta_path} lacks {', '.join(missing)}.",
            "Re-run `pipeline train` to write a fresh checkpoint.",
        )
    if meta["format"] != CHECKPOINT_FORMAT:
        raise _refuse(
            path,
            f"its format is {meta['format']!r}, this version reads {CHECKPOINT_FORMAT!r}.",
            "Re-run `pipeline train` with this version of the pipeline.",
        )
    return meta


def _blocked_global(err: Exception) -> str:
    """The line of torch's weights-only error that names what was refused."""
    for line in str(err).splitlines():
        if "GLOBAL" in line or "Unsupported" in line:
            return line.strip()
    return "torch.load(weights_only=True) refused it"


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Unpickle a state_dict with `weights_only=True`; refuse anything else."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise _refuse(
            path,
            "it is not a PyTorch checkpoint (torch.save writes a zip archive; this file is not one).",
            "Pass a .pt file written by `pipeline train` or `torch.save(model.state_dict(), path)`.",
        )
    try:
        # weights_only=True: only tensors and plain containers are unpickled;
        # anything that would import or call code is rejected by torch.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise _refuse(
            path,
            "it holds pickled objects beyond tensors, which could run code when loaded, "
            f"so it was not unpickled ({_blocked_global(err)}).",
            "Save only `model.state_dict()` with `torch.save` (`torch.save(model, path)` "
            "pickles the module's class as well).",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise _refuse(
            path,
            f"it is not a readable PyTorch checkpoint ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[0][:200]}).",
            "Pass the .pt file written by `pipeline train`, or train again.",
        ) from None
    if isinstance(state, dict) and not _is_state_dict(state):
        # Common wrappers: {"state_dict": ...} (Lightning-style) or {"model_state_dict": ...}.
        for key in ("state_dict", "model_state_dict", "model"):
            if _is_state_dict(state.get(key)):
                return state[key]
    if not _is_state_dict(state):
        raise _refuse(
            path,
            f"it holds a {type(state).__name__}, not a state_dict mapping names to tensors.",
            "Save `model.state_dict()`, not the model or a training state.",
        )
    return state


def _is_state_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
    )


def import_state_dict(src: Path, out: Path, meta: dict[str, Any]) -> Checkpoint:
    """Bring a state_dict saved elsewhere (no sidecar) into a checked checkpoint.

    The file is read with `weights_only=True`, exactly like our own
    checkpoints, then written with a sidecar recording where it came from.
    """
    src = Path(src)
    if not src.is_file():
        raise _refuse(
            src, "the file does not exist.", "Pass --weights with the path of a saved state_dict."
        )
    state = read_state_dict(src)
    checkpoint = save_checkpoint(
        out,
        state,
        {
            **meta,
            "init": "imported",
            "imported_from": str(src),
            "imported_sha256": sha256_file(src),
        },
    )
    return checkpoint


def load_checkpoint(path: Path) -> Checkpoint:
    """Load and check a checkpoint; every failure is a `CheckpointError`."""
    path = Path(path)
    meta = read_sidecar(path)
    actual = sha256_file(path)
    if actual != meta["weights_sha256"]:
        raise _refuse(
            path,
            f"its sha256 is {actual} but its metadata records {meta['weights_sha256']}; "
            "the weights were changed or truncated after training.",
            "Restore the original file or train again with `pipeline train`.",
        )
    state = read_state_dict(path)
    return Checkpoint(path=path, state_dict=state, meta=meta)
