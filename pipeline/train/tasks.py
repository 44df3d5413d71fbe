"""Training tasks: the data, loss and metric a zoo model is trained with.

A task's datasets yield `(*model_inputs, target)`; `prepare` turns a batch
into the positional inputs of the model's forward and the target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from pipeline.core.errors import PipelineError

Batch = Sequence[torch.Tensor]


def _split_last(batch: Batch) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    return tuple(batch[:-1]), batch[-1]


def _time_major(batch: Batch) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    # Datasets store sequences batch-first so the DataLoader can stack them;
    # the RNN family takes (seq, batch, features).
    xs, target = batch
    return (xs.transpose(0, 1).contiguous(),), target


def _first_output(outputs: Any) -> torch.Tensor:
    return outputs[0] if isinstance(outputs, tuple | list) else outputs


def _mse_on_first(outputs: Any, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.mse_loss(_first_output(outputs), target, reduction=reduction)


@dataclass(frozen=True)
class Task:
    name: str
    datasets: Callable[[str], tuple[Dataset, Dataset]]  # called with the zoo model's name
    loss: Callable[..., torch.Tensor]  # (outputs, target, reduction="mean")
    metric: str  # "val_accuracy" (higher is better) or "val_loss" (lower is better)
    prepare: Callable[[Batch], tuple[tuple[torch.Tensor, ...], torch.Tensor]] = _split_last
    description: str = ""


def _digits_datasets(model: str) -> tuple[Dataset, Dataset]:
    from pipeline.zoo.data import load_digits_split

    split = load_digits_split()
    return split.train, split.val


# The sequence task: imitate a fixed "teacher" network of the same
# architecture with other (seeded) weights. The student starts from its own
# seed, so the loss starts high and falls as it learns the teacher's function,
# gate branches included.
TEACHER_SEED = 20240521
DATA_SEED = 97
TRAIN_SEQUENCES = 1024
VAL_SEQUENCES = 256
SEQ_LEN = 6


@torch.no_grad()
def _teacher_datasets(model: str) -> tuple[Dataset, Dataset]:
    from pipeline.zoo import get_entry

    entry = get_entry(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TEACHER_SEED)
        teacher = entry.build().eval()
    gen = torch.Generator().manual_seed(DATA_SEED)
    names = [s.name for s in entry.inputs]
    total = TRAIN_SEQUENCES + VAL_SEQUENCES

    if names == ["xs"]:  # a whole sequence model
        xs = torch.randn(total, SEQ_LEN, 4, generator=gen)
        target = _first_output(teacher(xs.transpose(0, 1)))
        data = [xs, target]
    elif names == ["x", "h"]:  # one step of the cell
        x = torch.randn(total, 4, generator=gen)
        h = torch.tanh(torch.randn(total, 4, generator=gen))
        data = [x, h, _first_output(teacher(x, h))]
    else:  # pragma: no cover - only wired for the RNN family
        raise PipelineError(f"The rnn_teacher task does not know inputs {names}.")
    train = TensorDataset(*(t[:TRAIN_SEQUENCES] for t in data))
    val = TensorDataset(*(t[TRAIN_SEQUENCES:] for t in data))
    return train, val


TASKS: dict[str, Task] = {
    "digits": Task(
        name="digits",
        datasets=_digits_datasets,
        loss=F.cross_entropy,
        metric="val_accuracy",
        description="classify scikit-learn's handwritten digits",
    ),
    "rnn_teacher_seq": Task(
        name="rnn_teacher_seq",
        datasets=_teacher_datasets,
        loss=_mse_on_first,
        metric="val_loss",
        prepare=_time_major,
        description="imitate a seeded teacher RNN on random sequences (MSE)",
    ),
    "rnn_teacher_step": Task(
        name="rnn_teacher_step",
        datasets=_teacher_datasets,
        loss=_mse_on_first,
        metric="val_loss",
        description="imitate one step of a seeded teacher cell (MSE)",
    ),
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise PipelineError(f"Unknown task {name!r}; known: {', '.join(sorted(TASKS))}.") from None


@torch.no_grad()
def evaluate_sums(
    model: nn.Module, loader: DataLoader, task: Task, device: torch.device
) -> list[float]:
    """[loss × samples, correct predictions, samples] over `loader` (summable across ranks)."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for batch in loader:
        inputs, targets = task.prepare([t.to(device) for t in batch])
        outputs = model(*inputs)
        # Batch-weighted mean of the per-batch loss: the same scale as the
        # training loss whatever the loss's own reduction="sum" would mean.
        total_loss += float(task.loss(outputs, targets)) * targets.shape[0]
        if task.metric == "val_accuracy":
            correct += int((_first_output(outputs).argmax(dim=1) == targets).sum())
        count += targets.shape[0]
    return [total_loss, float(correct), float(count)]


def metrics_from_sums(task: Task, sums: list[float]) -> dict[str, float]:
    total_loss, correct, count = sums
    metrics = {"val_loss": total_loss / max(count, 1.0)}
    if task.metric == "val_accuracy":
        metrics["val_accuracy"] = correct / max(count, 1.0)
    return metrics
