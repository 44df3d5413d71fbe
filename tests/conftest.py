"""Shared fixtures. Tests are marked unit/integration/e2e from their folder.

Every test writes under pytest's tmp_path; none depends on the working
directory or on another test's order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.export import ExportConfig, ExportResult, export
from pipeline.train import TrainConfig, TrainResult, train

_FOLDER_MARKS = {"unit", "integration", "e2e"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.fspath).parent.name
        if folder in _FOLDER_MARKS:
            item.add_marker(getattr(pytest.mark, folder))
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs CUDA; none on this machine"))


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The default digits run (all default settings), trained once per session."""
    out = tmp_path_factory.mktemp("trained") / "digits_lenet" / "checkpoint.pt"
    return train(TrainConfig(out=out, progress=False, device="cpu"))


@pytest.fixture(scope="session")
def exported(trained: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    out_dir = tmp_path_factory.mktemp("exported") / "export"
    return export(ExportConfig(checkpoint=trained.checkpoint.path, out_dir=out_dir))
