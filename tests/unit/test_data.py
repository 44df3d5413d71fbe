import numpy as np
import pytest
import torch

from pipeline.zoo.data import DIGITS_SIZE, load_digits_split, preprocess_digits


def test_split_is_fixed_stratified_and_disjoint() -> None:
    a, b = load_digits_split(), load_digits_split()
    assert len(a.train) + len(a.val) == 1797
    assert len(a.val) == 361
    assert len(a.train) % 4 == 0  # even shards for 2 or 4 DDP processes
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert torch.equal(a.val.tensors[1], b.val.tensors[1])
    # Stratified: every class is in validation in roughly its share.
    counts = torch.bincount(a.val.tensors[1], minlength=10)
    assert counts.min() >= 34
    # Disjoint: no validation image also appears in training.
    train_rows = {row.numpy().tobytes() for row in a.train.tensors[0]}
    overlap = sum(row.numpy().tobytes() in train_rows for row in a.val.tensors[0])
    assert overlap <= 2  # sklearn's digits hold a couple of exact duplicates


def test_images_are_1x28x28_in_unit_range() -> None:
    x = load_digits_split().train.tensors[0]
    assert x.shape[1:] == (1, DIGITS_SIZE, DIGITS_SIZE)
    assert x.dtype == torch.float32
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    assert float(x.max()) > 0.9  # strokes reach full intensity


def test_preprocess_rejects_wrong_rank() -> None:
    with pytest.raises(ValueError, match=r"\(N, H, W\)"):
        preprocess_digits(np.zeros((1, 1, 8, 8)))
