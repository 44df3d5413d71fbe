import torch
from torch import nn


class TinyGated(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(6, width)
        self.out = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        if h.mean() > 0.5:
            h = h * scale
        return self.out(h)
