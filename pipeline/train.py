"""The training stage: a seeded, deterministic run that writes a checkpoint."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from pipeline import paths
from pipeline.checkpoint import Checkpoint, save_checkpoint
from pipeline.device import resolve_device
from pipeline.errors import PipelineError
from pipeline.seeding import seed_everything, seed_worker
from pipeline.tasks import evaluate, get_task
from pipeline.zoo import DEFAULT_MODEL, resolve_entry
from pipeline.zoo.user import is_external

log = logging.getLogger(__name__)


DEFAULTS: dict[str, Any] = {"epochs": 12, "batch_size": 64, "lr": 3e-3}


@dataclass
class TrainConfig:
    model: str = DEFAULT_MODEL
    out: Path | None = None  # default: artifacts/<model>/checkpoint.pt
    # None: the zoo entry's train_defaults, else DEFAULTS below.
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float = 1e-4
    seed: int = 0
    workers: int = 0
    device: str = "auto"
    progress: bool = True
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # override the zoo's

    def resolved(self, defaults: dict[str, Any]) -> TrainConfig:
        """A copy with every None filled from the model's defaults, then ours."""
        merged = {**DEFAULTS, **defaults}
        return replace(self, **{k: merged[k] for k in DEFAULTS if getattr(self, k) is None})

    def validate(self) -> None:
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise PipelineError(
                    f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}."
                )
        if not 0 <= self.seed < 2**63:
            raise PipelineError(f"--seed must be between 0 and 2**63 - 1, got {self.seed}.")
        if self.workers < 0:
            raise PipelineError(f"--workers must be 0 or more, got {self.workers}.")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise PipelineError(f"--lr must be a positive number, got {self.lr}.")


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Checkpoint
    history: list[dict[str, float]]
    seconds: float


def _initial_checkpoint(
    config: TrainConfig,
    name: str,
    kwargs: dict[str, Any],
    model: torch.nn.Module,
    out: Path,
    device: torch.device,
) -> TrainResult:
    """Models with nothing to learn (e.g. the parameter-free gate) get their
    seeded initial weights as a checkpoint, so export and verify treat every
    model the same way."""
    tqdm.write(f"{name} has no training task; writing its seeded initial weights")
    meta: dict[str, Any] = {
        "model": {"name": name, "kwargs": kwargs},
        "task": None,
        "init": "random",
        "seed": config.seed,
        "epochs": 0,
        "metrics": {"history": []},
        "device": str(device),
    }
    return TrainResult(save_checkpoint(out, model.state_dict(), meta), [], 0.0)


def train(config: TrainConfig) -> TrainResult:
    """Train `config.model` from scratch and write its checkpoint atomically."""
    if is_external(config.model):
        raise PipelineError(
            f"{config.model!r} is not a zoo model, so `pipeline train` has no task for it. Train it "
            "in your own code, save `model.state_dict()` with torch.save, and export it with "
            f"`pipeline export --model {config.model} --weights FILE` (or --random-init)."
        )
    entry = resolve_entry(config.model, kwargs=config.model_kwargs)
    config = config.resolved(dict(entry.train_defaults))
    config.validate()
    task = get_task(entry.task) if entry.task else None
    out = Path(config.out) if config.out else paths.checkpoint_path(entry.name)
    device = resolve_device(config.device)

    generator = seed_everything(config.seed)
    model = entry.build().to(device)
    if task is None:
        return _initial_checkpoint(config, entry.name, dict(entry.kwargs), model, out, device)
    train_set, val_set = task.datasets(entry.name)
    train_loader = DataLoader(
        train_set,
        batch_size=config.batch_size,
        shuffle=True,
        num_workers=config.workers,
        generator=generator,
        worker_init_fn=seed_worker,
        # A last batch of one sample would break BatchNorm1d in train mode.
        drop_last=len(train_set) % config.batch_size == 1,
        persistent_workers=config.workers > 0,
    )
    val_loader = DataLoader(val_set, batch_size=256, shuffle=False)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config.lr, total_steps=config.epochs * len(train_loader)
    )

    history: list[dict[str, float]] = []
    started = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        model.train()
        running, seen = 0.0, 0
        bar = tqdm(
            train_loader,
            desc=f"epoch {epoch}/{config.epochs}",
            unit="batch",
            leave=False,
            disable=not config.progress,
        )
        for batch in bar:
            inputs, targets = task.prepare([t.to(device) for t in batch])
            optimizer.zero_grad(set_to_none=True)
            loss = task.loss(model(*inputs), targets)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running += loss.item() * targets.shape[0]
            seen += targets.shape[0]
            bar.set_postfix(loss=f"{running / seen:.4f}")
        metrics = {
            "epoch": epoch,
            "train_loss": running / seen,
            **evaluate(model, val_loader, task, device),
        }
        history.append(metrics)
        shown = "  ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k != "epoch")
        tqdm.write(f"epoch {epoch}/{config.epochs}  {shown}")

    seconds = time.perf_counter() - started
    meta: dict[str, Any] = {
        "model": {"name": entry.name, "kwargs": dict(entry.kwargs)},
        "task": task.name,
        "seed": config.seed,
        "epochs": config.epochs,
        "metrics": {**{k: v for k, v in history[-1].items() if k != "epoch"}, "history": history},
        "train_config": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()
        },
        "device": str(device),
        "train_seconds": round(seconds, 2),
    }
    checkpoint = save_checkpoint(out, model.state_dict(), meta)
    log.info("wrote %s (sha256 %s)", out, checkpoint.meta["weights_sha256"])
    return TrainResult(checkpoint=checkpoint, history=history, seconds=seconds)
