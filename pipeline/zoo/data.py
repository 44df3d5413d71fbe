"""The built-in data: scikit-learn's handwritten digits, brought to 1×28×28.

The 1,797 8×8 images ship inside scikit-learn, so nothing is downloaded (they are
read from its package folder, without importing it). They
are scaled to [0, 1] and resized to the 28×28 that LeNet-style models expect;
the same `preprocess_digits` is what serving uses on incoming images.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

DIGITS_SIZE = 28
DIGITS_CLASSES = 10
# The validation split is fixed by its own seed so that every training seed is
# scored on the same images.
SPLIT_SEED = 20240601
# 361 validation images leave 1,436 for training: divisible by 2 and 4, so a
# DistributedSampler over 2 or 4 processes needs no padding and sees exactly
# the samples one process sees.
VAL_SIZE = 361
# The split itself: the indices sklearn's train_test_split(test_size=VAL_SIZE,
# random_state=SPLIT_SEED, stratify=labels) gives, in its order, stored so that reading the
# digits imports no sklearn (tests/unit/test_data.py recomputes them with it).
SPLIT_FILE = Path(__file__).with_name("digits_split.npz")
DIGITS_CSV = "digits.csv.gz"
_DIGITS_MAX = 16.0  # sklearn's digits are integer intensities 0..16


@dataclass(frozen=True)
class DigitsSplit:
    train: TensorDataset
    val: TensorDataset


def preprocess_digits(
    images: torch.Tensor | np.ndarray, max_value: float = _DIGITS_MAX
) -> torch.Tensor:
    """Turn a batch of (N, H, W) intensity images into float32 (N, 1, 28, 28) in [0, 1]."""
    x = torch.as_tensor(np.asarray(images), dtype=torch.float32)
    if x.ndim == 2:
        x = x.unsqueeze(0)
    if x.ndim != 3:
        raise ValueError(f"expected images shaped (N, H, W), got {tuple(x.shape)}")
    x = (x / max_value).clamp_(0.0, 1.0).unsqueeze(1)
    if x.shape[-2:] != (DIGITS_SIZE, DIGITS_SIZE):
        x = F.interpolate(x, size=(DIGITS_SIZE, DIGITS_SIZE), mode="bilinear", align_corners=False)
    return x.contiguous()


def digits_file() -> Path:
    """scikit-learn's digits.csv.gz, found without importing sklearn (importing it costs
    about 1.5 s of CPU, in every process that trains, exports or verifies a digits model)."""
    spec = importlib.util.find_spec("sklearn")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("scikit-learn is not installed: it ships the digits data")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / DIGITS_CSV


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float32, labels (1797,) int64), read as sklearn's load_digits
    reads them: 64 pixel columns, then the label."""
    with gzip.open(digits_file(), "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8).astype(np.float32), data[:, -1].astype(np.int64)


def load_digits_split() -> DigitsSplit:
    """The fixed, stratified train/validation split of the digits data."""
    images, labels = load_digits_arrays()
    with np.load(SPLIT_FILE) as split:
        train_idx, val_idx = split["train"].astype(np.int64), split["val"].astype(np.int64)
    x = preprocess_digits(images)
    y = torch.from_numpy(labels)
    return DigitsSplit(
        train=TensorDataset(x[train_idx], y[train_idx]),
        val=TensorDataset(x[val_idx], y[val_idx]),
    )


def digits_sample(count: int, offset: int = 0) -> torch.Tensor:
    """`count` real validation images (N, 1, 28, 28): golden inputs and probes use them."""
    return _validation_images()[offset : offset + count].clone()


@functools.cache
def _validation_images() -> torch.Tensor:
    # Loaded once per process: the split (reading the data, the resize) took ~70 ms a
    # call, and clients ask for samples request after request.
    return load_digits_split().val.tensors[0]
