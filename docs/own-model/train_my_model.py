"""Your own training code, standing in for whatever you already have: it trains MyModel
on scikit-learn's bundled iris measurements (nothing is downloaded) and saves its
state_dict, the one file `pipeline export --weights` needs.

    .venv/bin/python docs/own-model/train_my_model.py artifacts/my_model.pt
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from sklearn.datasets import load_iris
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from my_model import MyModel


def main(out: Path) -> None:
    torch.manual_seed(0)
    iris = load_iris()
    x = torch.tensor(iris.data, dtype=torch.float32)  # (150, 4), centimetres
    y = torch.tensor(iris.target)  # 0 setosa, 1 versicolor, 2 virginica

    model = MyModel()
    model.mean.copy_(x.mean(0))  # buffers: saved in the state_dict with the weights
    model.std.copy_(x.std(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(200):  # the 150 rows as one batch
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    model.eval()

    accuracy = (model(x).argmax(1) == y).float().mean().item()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    print(f"training accuracy {accuracy:.3f}; state_dict saved to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
