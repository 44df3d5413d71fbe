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


class SeqLoop(nn.Module):
    """No gate, but a Python loop over the sequence: a trace unrolls it."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(xs.size(1), 4)
        for i in range(xs.size(0)):
            h = torch.tanh(self.cell(xs[i]) + h)
        return h


class Unsplittable(nn.Module):
    """Neither traceable (data-dependent branch) nor scriptable (numpy call)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy as np

        y = self.fc(x)
        if float(y.sum()) > 0:
            return y * float(np.float32(2.0))
        return y


class Embedder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.emb(tokens).sum(dim=1)


class DictHeads(nn.Module):
    """Returns a dict: its keys must name the outputs everywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.fc(x), "embedding": torch.tanh(x)}


class Vocab50(nn.Module):
    """An embedding of exactly 50 words: inputs declared 0:50 must never reach 50."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids).sum(dim=1)


class BatchCapped(nn.Module):
    """Takes another path above 64 samples (the same function), as CUDA's batch norm picks
    its kernel from the batch: torch.export can only bound the batch axis, not keep it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 64:
            return torch.cat([self.fc(x[:64]), self.fc(x[64:])])
        return self.fc(x)
