"""Resumable training state: everything `--resume` needs besides the weights.

Saved atomically after every epoch as `<checkpoint stem>.state.pt` next to the
checkpoint: model, optimizer, LR scheduler and GradScaler state dicts, every
RNG the run draws from, the epoch reached and the metric history. It holds
only tensors, numbers, strings and containers, so it loads with
`torch.load(weights_only=True)` like everything else here.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.errors import CheckpointError
from pipeline.core.fileio import atomic_write

STATE_FORMAT = "pipeline.train.state/1"


def state_path(checkpoint: Path) -> Path:
    return Path(checkpoint).with_suffix(".state.pt")


def _python_rng() -> tuple[int, list[int], float | None]:
    version, internal, gauss = random.getstate()
    return version, list(internal), gauss


def capture_rng(loader_generator: torch.Generator) -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "loader": loader_generator.get_state(),
        "python": dict(zip(("version", "state", "gauss"), _python_rng(), strict=True)),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], loader_generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    loader_generator.set_state(state["loader"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(path: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save({**state, "format": STATE_FORMAT}, buffer)
    data = buffer.getvalue()
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def load_state(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"Cannot resume: {path} does not exist. It is written after every epoch of a "
            "`pipeline train` run; start one without --resume first."
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable state gets the same advice
        raise CheckpointError(f"Cannot resume from {path}: it cannot be read ({err}).") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"Cannot resume from {path}: it is not a {STATE_FORMAT} file.")
    return state
