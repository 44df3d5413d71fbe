"""What a person wants to see about a training run: a model summary and a plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from pipeline.core.fileio import atomic_write


def model_summary(model: nn.Module, inputs: Sequence[torch.Tensor]) -> str:
    """Layers, output shapes and parameter counts (torchinfo), as text."""
    from torchinfo import summary

    # Eval mode and a forked RNG: the summary's forward pass must neither
    # update BatchNorm statistics nor draw dropout masks, or a run with a
    # summary would train differently from one without (and from its resume).
    was_training = model.training
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        stats = summary(
            model,
            input_data=list(inputs),
            col_names=("output_size", "num_params"),
            depth=4,
            verbose=0,
            mode="eval",
            device=next((p.device for p in model.parameters()), torch.device("cpu")),
        )
    model.train(was_training)
    return str(stats)


def plot_history(history: Sequence[dict[str, float]], target: Path, title: str) -> Path:
    """PNG of train/validation loss (and validation accuracy) per epoch."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file
    import matplotlib.pyplot as plt

    epochs = [int(h["epoch"]) for h in history]
    has_acc = any("val_accuracy" in h for h in history)
    fig, axes = plt.subplots(
        1, 2 if has_acc else 1, figsize=(10 if has_acc else 5.5, 4), squeeze=False
    )
    ax = axes[0][0]
    ax.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train loss")
    ax.plot(epochs, [h["val_loss"] for h in history], marker="o", label="validation loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    if has_acc:
        ax = axes[0][1]
        ax.plot(epochs, [h["val_accuracy"] for h in history], marker="o", color="tab:green")
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(target, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return target
