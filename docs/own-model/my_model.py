"""A user's own model for docs/own-model.md: a small tabular classifier.

Four measurements of an iris flower in centimetres (sepal length and width, petal length
and width) → one score per species (setosa, versicolor, virginica). The standardisation
the model needs is part of the module (two buffers, saved in its state_dict), so every
exported format, the C++ client and both servers take raw measurements.
"""

from __future__ import annotations

import torch
from torch import nn


class MyModel(nn.Module):
    def __init__(self, features: int = 4, hidden: int = 16, classes: int = 3) -> None:
        super().__init__()
        # Set from the training data by train_my_model.py, saved with the weights.
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("std", torch.ones(features))
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, measurements: torch.Tensor) -> torch.Tensor:
        return self.net((measurements - self.mean) / self.std)
