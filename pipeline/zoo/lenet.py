"""A LeNet-style CNN for the 28×28 digits, after d2l's LeNet (d2l.ai, ch. 7.6).

BatchNorm and Dropout are there on purpose: their train-mode behaviour differs
from eval mode, so an export that forgets `model.eval()` is caught by verify.
"""

from __future__ import annotations

import torch
from torch import nn


class DigitsLeNet(nn.Module):
    """conv(5) → BN → ReLU → avgpool, twice; then three linear layers with dropout."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.25) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=5, padding=2),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AvgPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120),
            nn.BatchNorm1d(120),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(84, num_classes),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(image))


class DigitsMLP(nn.Module):
    """A BatchNorm- and Dropout-free MLP: every sample is computed on its own.

    The reference for distributed training: with no batch statistics, N
    processes over batches of B/N compute what one process computes over B.
    """

    def __init__(self, num_classes: int = 10, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.net(image)
