"""Where each stage reads and writes by default: one tree under one directory.

    artifacts/<model>/checkpoint.pt      state_dict      (train)
    artifacts/<model>/checkpoint.json    sidecar         (train)
    artifacts/<model>/export/            TorchScript, ONNX, golden I/O, manifest.json (export)
    artifacts/<model>/parity.json        parity report   (verify)
    artifacts/bench/fastest.json         fastest verified backend per model (bench → archive)

`PIPELINE_ARTIFACTS` or `--artifacts-dir` moves the whole tree. TorchServe's
archives go to `model_store/` (`DEFAULT_STORE`, `--store`), outside it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_ARTIFACTS = Path("artifacts")
# `pipeline archive` writes and `pipeline serve` serves the .mar files here (a
# torch-free home for pipeline.runtimes.torchserve.archive's default, which the CLI shows).
DEFAULT_STORE = Path("model_store")


ARTIFACTS_ENV = "PIPELINE_ARTIFACTS"  # the CLI sets it from --artifacts-dir, for its children


def artifacts_root(override: Path | None = None) -> Path:
    if override is not None:
        return Path(override)
    return Path(os.environ.get(ARTIFACTS_ENV, DEFAULT_ARTIFACTS))


def is_external(name: str) -> bool:
    """True for `module:Class`, `file.py:Class` and `torchvision:NAME` specs."""
    return ":" in name


def model_slug(name: str) -> str:
    """A directory name for a model spec: 'torchvision:resnet18' → 'torchvision_resnet18'."""
    if not is_external(name):
        return name
    where, _, cls = name.rpartition(":")
    stem = Path(where).stem if where.endswith(".py") else where
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{stem}_{cls}").strip("_")


def model_dir(model: str, root: Path | None = None) -> Path:
    return artifacts_root(root) / model_slug(model)


def checkpoint_path(model: str, root: Path | None = None) -> Path:
    return model_dir(model, root) / "checkpoint.pt"


def export_dir(model: str, root: Path | None = None) -> Path:
    return model_dir(model, root) / "export"


def bench_dir(root: Path | None = None) -> Path:
    """Where `pipeline bench` writes (bench.json, bench.md, charts, fastest.json)."""
    return artifacts_root(root) / "bench"


def fastest_path(root: Path | None = None) -> Path:
    """Bench's choice of each model's fastest verified backend, read by `pipeline archive`."""
    return bench_dir(root) / "fastest.json"


def report_path(model: str, root: Path | None = None, export: Path | None = None) -> Path:
    """Verify's report of `export` (default: the model's own export folder):
    <model>/parity.json, or beside another folder X, X.parity.json, so that checking a
    second export never writes over the report publish reads for the first."""
    default = model_dir(model, root) / "parity.json"
    if export is None:
        return default
    there = Path(export).resolve()
    if there == export_dir(model, root).resolve() or not there.name:
        return default
    return there.with_name(there.name + ".parity.json")
