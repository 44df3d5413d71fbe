"""Seed discipline for reproducible training.

Follows PyTorch's reproducibility notes
(https://pytorch.org/docs/stable/notes/randomness.html): seed every RNG the
run touches, ask for deterministic kernels, and give each DataLoader worker a
seed derived from the loader's own generator.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

# cuBLAS needs a fixed workspace for deterministic matmuls on CUDA >= 10.2;
# it must be set before the first cuBLAS handle is created.
_CUBLAS_WORKSPACE = ":4096:8"


def seed_everything(seed: int, *, deterministic: bool = True) -> torch.Generator:
    """Seed `random`, numpy and torch; return a seeded generator for DataLoaders."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def seed_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: seed numpy and `random` in each worker.

    torch already seeds each worker with `base_seed + worker_id`, where
    `base_seed` comes from the loader's generator; numpy and `random` are
    derived from that so augmentations in workers are reproducible too.
    """
    del worker_id  # torch.initial_seed() already differs per worker
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
