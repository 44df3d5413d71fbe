"""Where an export's weights come from: our checkpoint, an imported state_dict, or seeded
random initialisation (with calibrated normalisation statistics, see random_init)."""

from __future__ import annotations

from pathlib import Path

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
    try:
        model.load_state_dict(checkpoint.state_dict, strict=True)
    except RuntimeError as err:
        # Imported by --weights: name the user's file, not the checkpoint it was to become.
        imported = checkpoint.meta.get("imported_from")
        what = (
            f"The state_dict in {imported} (--weights)" if imported else f"Checkpoint {ckpt_path}"
        )
        raise CheckpointError(
            f"{what} does not fit model {entry.name!r}: "
            f"{' '.join(str(err).split())[:400]} "
            + (
                "Train it again with `pipeline train`."
                if entry.source == "zoo"
                else "Check that --weights and --model-kwargs belong to this class."
            )
        ) from None
    return model
