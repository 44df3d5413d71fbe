"""Recurrent models built on the library's layers, with a dynamic sequence axis.

What people deploy with nn.LSTM and nn.GRU: a token tagger (one label per
token) and a sequence encoder (one vector per sequence). Both are written the
plain way, `self.rnn(x)`; making them exportable by torch.export with the
sequence axis dynamic is the export stage's job
(pipeline/formats/recurrent.py). Nothing to train: they are exported from
their seeded initial weights, like the decision gate.
"""

from __future__ import annotations

import torch
from torch import nn


class LstmTagger(nn.Module):
    """Embedding → 2-layer bidirectional LSTM (batch_first) → Linear: a tag score per token.

    `tokens` (batch, seq) int64 → `tag_logits` (batch, seq, tags).
    """

    def __init__(
        self, vocab: int = 1000, embed: int = 32, hidden: int = 64, layers: int = 2, tags: int = 9
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = nn.LSTM(
            embed, hidden, num_layers=layers, batch_first=True, bidirectional=True, dropout=0.1
        )
        self.tags = nn.Linear(2 * hidden, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.embed(tokens))
        return self.tags(states)


class GruEncoder(nn.Module):
    """2-layer bidirectional GRU over feature frames → one vector per sequence.

    `frames` (batch, seq, features) → `embedding` (batch, dim): the last layer's
    final states of both directions, with the mean of its outputs over time,
    through a Linear (a speech or sensor front-end's shape).
    """

    def __init__(
        self, features: int = 20, hidden: int = 64, layers: int = 2, dim: int = 16
    ) -> None:
        super().__init__()
        self.rnn = nn.GRU(features, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.project = nn.Linear(4 * hidden, dim)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        outputs, h_n = self.rnn(frames)
        final = torch.cat([h_n[-2], h_n[-1]], dim=-1)  # the last layer, both directions
        return self.project(torch.cat([final, outputs.mean(dim=1)], dim=-1))
