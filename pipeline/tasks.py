"""Training tasks: the data, loss and metric a zoo model is trained with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Task:
    name: str
    datasets: Callable[[], tuple[Dataset, Dataset]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # Name of the validation metric reported each epoch ("higher is better").
    metric: str


def _digits_datasets() -> tuple[Dataset, Dataset]:
    from pipeline.data import load_digits_split

    split = load_digits_split()
    return split.train, split.val


TASKS: dict[str, Task] = {
    "digits": Task(
        name="digits",
        datasets=_digits_datasets,
        loss=F.cross_entropy,
        metric="val_accuracy",
    ),
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise PipelineError(f"Unknown task {name!r}; known: {', '.join(sorted(TASKS))}.") from None


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, task: Task, device: torch.device
) -> dict[str, float]:
    """Mean validation loss and, for classification, accuracy."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = model(inputs)
        total_loss += float(task.loss(outputs, targets, reduction="sum"))
        if task.metric == "val_accuracy":
            correct += int((outputs.argmax(dim=1) == targets).sum())
        count += targets.shape[0]
    metrics = {"val_loss": total_loss / max(count, 1)}
    if task.metric == "val_accuracy":
        metrics["val_accuracy"] = correct / max(count, 1)
    return metrics
