"""Users' recurrent models that torch.export cannot keep dynamic along the sequence."""

from __future__ import annotations

import torch
from torch import nn


class LoopRNN(nn.Module):
    """A hand-written recurrent cell, looped in Python over the sequence (batch, seq, 8)."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.cell = nn.Linear(2 * hidden, hidden)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.size(0), self.hidden)
        for t in range(x.size(1)):
            h = torch.tanh(self.cell(torch.cat([x[:, t], h], dim=-1)))
        return h


class NormedLSTM(nn.LSTM):
    """An nn.LSTM subclass with its own forward (it normalises the input first)."""

    def forward(self, x, hx=None):  # type: ignore[override]
        return super().forward(x / (x.norm(dim=-1, keepdim=True) + 1e-6), hx)


class NormedTagger(nn.Module):
    """frames (batch, seq, 8) → NormedLSTM → Linear: a score per step."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = NormedLSTM(8, 8, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(x)[0])
