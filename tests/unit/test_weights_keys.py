"""--weights for a user's own model: a state_dict whose keys differ by one prefix (a
wrapper `self.detector = fasterrcnn(...)` given the detector's own state_dict) and one
that does not fit. The first failed with torch's text cut at 400 characters mid-key, the
file's keys never shown; the second's size mismatch was cut mid-word (a user's trial)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pipeline.core.errors import CheckpointError
from pipeline.export.weights import checkpoint_for, model_from
from pipeline.zoo import resolve_entry
from pipeline.zoo.spec import TensorSpec

SOURCE = """
from torch import nn


class Inner(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


class Wrap(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.detector = Inner(classes)

    def forward(self, x):
        return self.detector(x)
"""


def _load(tmp_path: Path, name: str, state: dict, **kwargs: int) -> nn.Module:
    (tmp_path / "mine.py").write_text(SOURCE)
    weights = tmp_path / "w.pt"
    torch.save(state, weights)
    entry = resolve_entry(
        f"{tmp_path / 'mine.py'}:{name}",
        kwargs=kwargs,
        inputs=[TensorSpec("x", ("batch", 4))],
    )
    ck = tmp_path / name / "checkpoint.pt"
    ck.parent.mkdir(exist_ok=True)
    golden = {"x": torch.zeros(1, 4)}
    found = checkpoint_for(
        entry, ck, weights=weights, random_init=False, seed=0, golden=golden, atol=1e-5, rtol=1e-4
    )
    return model_from(entry, found, ck)


def _module(tmp_path: Path) -> Any:
    """SOURCE imported as the user's file is, for the state_dicts a user would save."""
    (tmp_path / "mine.py").write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("mine_src", tmp_path / "mine.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_a_state_dict_one_prefix_away_loads_into_the_wrapper_and_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    inner = _module(tmp_path).Inner()
    wrap = _load(tmp_path, "Wrap", inner.state_dict())  # the detector's own keys
    torch.testing.assert_close(wrap.detector.head.weight, inner.head.weight)
    back = _load(tmp_path, "Inner", wrap.state_dict())  # the wrapper's keys, into the inner
    torch.testing.assert_close(back.head.weight, inner.head.weight)


def test_a_state_dict_that_does_not_fit_says_which_keys_and_shapes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    five = _module(tmp_path).Wrap(5).state_dict()
    with pytest.raises(CheckpointError) as err:
        _load(tmp_path, "Wrap", five, classes=3)
    said = str(err.value)
    assert "2 shapes differ (first: detector.head.weight: the file's [5, 8], the model's" in said
    other = {"something.else": torch.zeros(1)}
    with pytest.raises(CheckpointError) as err:
        _load(tmp_path, "Wrap", other)
    said = str(err.value)
    assert "6 of the model's keys are not in the file (first: detector.backbone.0.weight" in said
    assert "1 of the file's keys are not the model's (first: something.else)" in said
