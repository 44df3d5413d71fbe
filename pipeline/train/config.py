"""What `pipeline train` is asked (TrainConfig, checked before anything runs) and what a
run gives back (TrainResult)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.core import paths
from pipeline.core.checkpoint import Checkpoint
from pipeline.core.errors import PipelineError
from pipeline.zoo import DEFAULT_MODEL

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
    # Mixed precision: fp16 autocast + GradScaler on CUDA, bf16 autocast on CPU.
    amp: bool = False
    clip_grad_norm: float | None = None
    # Continue from <checkpoint>.state.pt (written after every epoch).
    resume: bool = False
    # Stop cleanly after this epoch, as an interrupted run would; --resume continues.
    stop_after_epoch: int | None = None
    report: bool = True  # model summary (torchinfo) and loss/accuracy plot (PNG)

    @classmethod
    def from_args(cls, args: argparse.Namespace, model: str) -> TrainConfig:
        """The config `pipeline train` ARGS describe, for `model` (one of its --model)."""
        from pipeline.zoo.user import parse_kwargs

        return cls(
            model=model,
            out=args.out or paths.checkpoint_path(model, args.artifacts_dir),
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            workers=args.workers,
            device=args.device,
            progress=not args.no_progress,
            model_kwargs=parse_kwargs(args.model_kwargs),
            amp=args.amp,
            clip_grad_norm=args.clip_grad_norm,
            resume=args.resume,
            stop_after_epoch=args.stop_after_epoch,
            report=not args.no_report,
        )

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
        if self.clip_grad_norm is not None and not (
            self.clip_grad_norm > 0 and math.isfinite(self.clip_grad_norm)
        ):
            raise PipelineError(
                f"--clip-grad-norm must be a positive number, got {self.clip_grad_norm}."
            )
        if self.stop_after_epoch is not None and not 1 <= self.stop_after_epoch <= self.epochs:
            raise PipelineError(
                f"--stop-after-epoch must be between 1 and --epochs ({self.epochs})."
            )
        if self.out is not None and Path(self.out).is_dir():  # before an epoch is spent
            raise PipelineError(
                f"--out {self.out} is a folder; give the checkpoint's file name, e.g. "
                f"--out {Path(self.out) / 'checkpoint.pt'}."
            )


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Checkpoint
    history: list[dict[str, float]]
    seconds: float
    completed: bool = True  # False when stopped early by --stop-after-epoch
    plot: Path | None = None
    summary: str = ""
