"""Where each stage reads and writes by default: one tree under one directory.

    artifacts/<model>/checkpoint.pt      state_dict      (train)
    artifacts/<model>/checkpoint.json    sidecar         (train)
    artifacts/<model>/export/            TorchScript, ONNX, golden I/O, manifest.json (export)
    artifacts/<model>/parity.json        parity report   (verify)

`PIPELINE_ARTIFACTS` or `--artifacts-dir` moves the whole tree.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ARTIFACTS = Path("artifacts")


def artifacts_root(override: Path | None = None) -> Path:
    if override is not None:
        return Path(override)
    return Path(os.environ.get("PIPELINE_ARTIFACTS", DEFAULT_ARTIFACTS))


def model_dir(model: str, root: Path | None = None) -> Path:
    from pipeline.zoo.user import model_slug  # 'torchvision:resnet18' → 'torchvision_resnet18'

    return artifacts_root(root) / model_slug(model)


def checkpoint_path(model: str, root: Path | None = None) -> Path:
    return model_dir(model, root) / "checkpoint.pt"


def export_dir(model: str, root: Path | None = None) -> Path:
    return model_dir(model, root) / "export"


def report_path(model: str, root: Path | None = None) -> Path:
    return model_dir(model, root) / "parity.json"
