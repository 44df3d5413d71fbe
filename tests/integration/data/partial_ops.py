"""Models for partial exports and --random-init: an op ONNX lacks, a norm-free deep net."""

import torch
from torch import nn


class EigenNet(nn.Module):
    """Eigenvalue magnitudes of a learned 3×3 matrix per sample.

    `torch.linalg.eigvals` has no ONNX conversion (neither exporter, opset 18),
    while TorchScript and torch.export + AOTInductor run it (a LAPACK call).
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(9, 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.fc(x).reshape(-1, 3, 3)
        return torch.linalg.eigvals(m).abs()


class DeepTanh(nn.Module):
    """No normalisation layers, no biases: each randomly initialised Linear (weights
    uniform in ±1/sqrt(fan_in)) divides the signal's variance by 3, so after 20
    layers the outputs are around 1e-5 and nothing can be calibrated."""

    def __init__(self, depth: int = 20, width: int = 16) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width, bias=False), nn.Tanh()]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class NormOfOne(nn.Module):
    """BatchNorm over a batch that is always 1: train-mode statistics cannot be computed."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x))
