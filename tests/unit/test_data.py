import subprocess
import sys

import numpy as np
import pytest
import torch

from pipeline.zoo.data import (
    DIGITS_SIZE,
    SPLIT_FILE,
    SPLIT_SEED,
    VAL_SIZE,
    load_digits_arrays,
    load_digits_split,
    preprocess_digits,
)


def test_the_data_and_the_stored_split_are_sklearn_s() -> None:
    """What sklearn's load_digits and stratified train_test_split give: read and stored
    without importing sklearn (the split's indices in SPLIT_FILE, in its order)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images, labels = load_digits_arrays()
    np.testing.assert_array_equal(images, bunch.images.astype(np.float32))
    np.testing.assert_array_equal(labels, bunch.target)
    train, val = train_test_split(
        np.arange(len(labels)), test_size=VAL_SIZE, random_state=SPLIT_SEED, stratify=labels
    )
    with np.load(SPLIT_FILE) as stored:
        np.testing.assert_array_equal(stored["train"], train)
        np.testing.assert_array_equal(stored["val"], val)
    split = load_digits_split()
    assert torch.equal(split.val.tensors[1], torch.from_numpy(labels[val]))
    assert torch.equal(split.train.tensors[0], preprocess_digits(images[train]))


def test_reading_the_digits_imports_no_sklearn() -> None:
    code = (
        "import sys; from pipeline.zoo.data import load_digits_split; load_digits_split(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


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
