"""Where an export's weights come from: our checkpoint, an imported state_dict, or seeded
random initialisation (with calibrated normalisation statistics, see random_init)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from pipeline.core.checkpoint import (
    Checkpoint,
    import_state_dict,
    load_checkpoint,
    save_checkpoint,
)
from pipeline.core.errors import CheckpointError
from pipeline.export.random_init import initialise
from pipeline.zoo.spec import Inputs, ZooEntry

log = logging.getLogger(__name__)


def checkpoint_for(
    entry: ZooEntry,
    ckpt_path: Path,
    *,
    weights: Path | None,
    random_init: bool,
    seed: int,
    golden: Inputs,
    atol: float,
    rtol: float,
) -> Checkpoint:
    """Our checkpoint at `ckpt_path`, first imported (`weights`) or initialised when asked.

    `golden`: the inputs export checks against, on which a random-init model's
    output scale is measured; `atol`/`rtol`: the tolerance its warning quotes.
    """
    meta = {"model": {"name": entry.name, "kwargs": dict(entry.kwargs)}, "seed": seed, "epochs": 0}
    if weights is not None:
        return import_state_dict(weights, ckpt_path, meta)
    if random_init:
        model, done = initialise(entry, seed, golden, atol=atol, rtol=rtol)
        extra = {"init": "random", "init_note": done.note, "calibration": done.to_json()}
        return save_checkpoint(ckpt_path, model.state_dict(), {**meta, **extra})
    if not ckpt_path.exists() and entry.source != "zoo":
        raise CheckpointError(
            f"Cannot use checkpoint {ckpt_path}: the file does not exist. {entry.name!r} is not "
            "trained by this pipeline: pass --weights FILE (a state_dict saved with torch.save) "
            "or --random-init to export it with seeded random weights."
        )
    return load_checkpoint(ckpt_path)


def model_from(entry: ZooEntry, checkpoint: Checkpoint, ckpt_path: Path) -> nn.Module:
    """`entry`'s model with the checkpoint's weights; `CheckpointError` when they do not fit."""
    if checkpoint.model_name != entry.name:
        raise CheckpointError(
            f"Checkpoint {ckpt_path} holds model {checkpoint.model_name!r}, not {entry.name!r}. "
            f"Pass --model {checkpoint.model_name} or the checkpoint of {entry.name}."
        )
    model = entry.build(**checkpoint.model_kwargs)
    given = checkpoint.state_dict
    # A user's wrapper (self.detector = ...) given the wrapped model's own state_dict, or
    # the reverse: the keys differ by one prefix, which says how they map.
    rekeyed = _rekeyed(list(model.state_dict()), given) if entry.source != "zoo" else None
    if rekeyed is not None:
        given, how = rekeyed
        log.info("loading %s: every key of the file %s", entry.name, how)
    try:
        model.load_state_dict(given, strict=True)
    except RuntimeError:
        # Imported by --weights: name the user's file, not the checkpoint it was to become.
        imported = checkpoint.meta.get("imported_from")
        what = (
            f"The state_dict in {imported} (--weights)" if imported else f"Checkpoint {ckpt_path}"
        )
        raise CheckpointError(
            f"{what} does not fit model {entry.name!r}: {_misfit(model, given)}. "
            + (
                "Train it again with `pipeline train`."
                if entry.source == "zoo"
                else "Check that --weights and --model-kwargs belong to this class."
            )
        ) from None
    return model


def _rekeyed(mine: list[str], given: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """`given` with one prefix added to (or removed from) every key, when that makes its
    keys exactly `mine`, and how; None otherwise."""
    want, have = set(mine), set(given)
    missing = sorted(want - have)
    if not missing or not have - want:
        return None
    for key in sorted(have, key=len, reverse=True):  # the longest suffix of a missing key
        if missing[0].endswith("." + key):
            prefix = missing[0][: -len(key)]
            if {prefix + k for k in have} == want:
                return {prefix + k: v for k, v in given.items()}, f"given the prefix {prefix!r}"
        if key.endswith("." + missing[0]):
            prefix = key[: -len(missing[0])]
            if (
                all(k.startswith(prefix) for k in have)
                and {k.removeprefix(prefix) for k in have} == want
            ):
                stripped = {k.removeprefix(prefix): v for k, v in given.items()}
                return stripped, f"without its prefix {prefix!r}"
    return None


def _misfit(model: nn.Module, given: dict[str, Any]) -> str:
    """What differs between the model's keys and shapes and the file's, briefly."""
    mine = model.state_dict()
    missing = [k for k in mine if k not in given]
    unexpected = [k for k in given if k not in mine]
    shapes = [
        f"{k}: the file's {list(given[k].shape)}, the model's {list(v.shape)}"
        for k, v in mine.items()
        if k in given and hasattr(given[k], "shape") and tuple(given[k].shape) != tuple(v.shape)
    ]
    said = [
        f"{len(found)} {what} (first: {', '.join(found[:3])})"
        for found, what in (
            (missing, "of the model's keys are not in the file"),
            (unexpected, "of the file's keys are not the model's"),
            (shapes, "shapes differ"),
        )
        if found
    ]
    return "; ".join(said) or "load_state_dict refused it"
