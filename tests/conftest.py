"""Shared fixtures. Tests are marked unit/integration/e2e from their folder.

Every test writes under pytest's tmp_path; none depends on the working
directory or on another test's order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.export import FORMATS, ExportConfig, ExportResult, export
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
    """The digits CNN in every format (TorchScript, ONNX, .pt2)."""
    out_dir = tmp_path_factory.mktemp("exported") / "export"
    return export(
        ExportConfig(checkpoint=trained.checkpoint.path, out_dir=out_dir, formats=FORMATS)
    )


@pytest.fixture(scope="session")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """torchvision's mobilenet_v3_small, --random-init (BatchNorm statistics calibrated,
    so its outputs have a realistic scale), as TorchScript and ONNX."""
    root = tmp_path_factory.mktemp("mobilenet")
    return export(
        ExportConfig(
            model="torchvision:mobilenet_v3_small",
            random_init=True,
            checkpoint=root / "checkpoint.pt",
            out_dir=root / "export",
            formats=("torchscript", "onnx"),
        )
    )


# The built-in models with data-dependent control flow (the TorchScript tutorial's).
FAMILY = ["my_decision_gate", "my_cell", "my_rnn_loop", "wrap_rnn"]


@pytest.fixture(scope="session")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExportResult]:
    """The control-flow family, trained and exported (every format) once per session."""
    root = tmp_path_factory.mktemp("family")
    results = {}
    for name in FAMILY:
        config = TrainConfig(
            model=name, out=root / name / "checkpoint.pt", progress=False, device="cpu"
        )
        ckpt = train(config)
        results[name] = export(
            ExportConfig(
                model=name,
                checkpoint=ckpt.checkpoint.path,
                out_dir=root / name / "export",
                formats=FORMATS,
            )
        )
    return results


@pytest.fixture(scope="session")
def all_exports(exported: ExportResult, family: dict[str, ExportResult]) -> dict[str, ExportResult]:
    """Every built-in model's export: the digits CNN and the control-flow family."""
    return {"digits_lenet": exported, **family}


@pytest.fixture(scope="session")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++ client, built for real once per session under pytest's temp dir."""
    from pipeline.formats import cpp

    return cpp.build(tmp_path_factory.mktemp("cpp_build"))


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m pipeline ARGS` as a user runs it (warnings off, output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Non-zero exit, one readable message naming the problem, no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "\nerror: " in "\n" + proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr
