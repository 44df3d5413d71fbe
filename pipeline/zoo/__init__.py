"""The model zoo: built-in models by name."""

from __future__ import annotations

import torch

from pipeline.data import DIGITS_CLASSES, DIGITS_SIZE, digits_sample
from pipeline.errors import UnknownModelError
from pipeline.zoo.lenet import DigitsLeNet
from pipeline.zoo.spec import Inputs, TensorSpec, ZooEntry

__all__ = ["Inputs", "TensorSpec", "ZooEntry", "get_entry", "zoo_names"]


def _digits_golden() -> Inputs:
    return {"image": digits_sample(8)}


def _digits_probes(generator: torch.Generator) -> list[tuple[str, Inputs]]:
    # No control flow to drive; probes cover batch sizes 1 and >1 on real
    # images and the extremes of the input range.
    return [
        ("real b=1", {"image": digits_sample(1, offset=100)}),
        ("real b=5", {"image": digits_sample(5, offset=200)}),
        ("zeros b=2", {"image": torch.zeros(2, 1, DIGITS_SIZE, DIGITS_SIZE)}),
        ("ones b=3", {"image": torch.ones(3, 1, DIGITS_SIZE, DIGITS_SIZE)}),
    ]


_ENTRIES: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry(
            name="digits_lenet",
            description="LeNet-style CNN (BatchNorm + Dropout) for scikit-learn's digits at 28×28",
            builder=DigitsLeNet,
            kwargs={"num_classes": DIGITS_CLASSES, "dropout": 0.25},
            inputs=(TensorSpec("image", ("batch", 1, DIGITS_SIZE, DIGITS_SIZE)),),
            outputs=("logits",),
            task="digits",
            golden=_digits_golden,
            probes=_digits_probes,
        ),
    ]
}

DEFAULT_MODEL = "digits_lenet"


def zoo_names() -> list[str]:
    return sorted(_ENTRIES)


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called `name`, or a clear error listing the known names."""
    try:
        return _ENTRIES[name]
    except KeyError:
        raise UnknownModelError(
            f"Unknown model {name!r}. Known models: {', '.join(zoo_names())}. "
            "Run `pipeline models` to see what each one is."
        ) from None
