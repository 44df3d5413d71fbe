"""Altering an export the way a broken exporter would: the file changes and the
manifest's sha256 is updated with it, so only the numbers can catch it."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from pipeline.export import ExportResult
from pipeline_runtime.files import sha256_file
from pipeline_runtime.manifest import MANIFEST_NAME, Manifest


def copy_export(result: ExportResult, dst: Path) -> Path:
    """A private copy of an export to tamper with (its checkpoint stays where it is)."""
    shutil.copytree(result.out_dir, dst)
    manifest = Manifest.read(dst)
    where = (result.out_dir / manifest.checkpoint.path).resolve()
    _write(dst, replace(manifest, checkpoint=replace(manifest.checkpoint, path=str(where))))
    return dst


def _write(export_dir: Path, manifest: Manifest) -> None:
    (export_dir / MANIFEST_NAME).write_text(manifest.dumps())


def reseal(export_dir: Path, key: str) -> None:
    """Record artifact `key`'s new sha256, as a broken exporter would have written it."""
    manifest = Manifest.read(export_dir)
    record = manifest.artifacts[key]
    sealed = replace(record, sha256=sha256_file(export_dir / record.file))
    _write(export_dir, replace(manifest, artifacts={**manifest.artifacts, key: sealed}))


def alter_onnx_initializer(
    export_dir: Path,
    initializer: str,
    change: Callable[[np.ndarray], np.ndarray],
    key: str = "onnx",
) -> None:
    """Change one initializer of artifact `key`'s ONNX graph (its dtype kept) and reseal."""
    path = export_dir / Manifest.read(export_dir).artifacts[key].file
    model = onnx.load(str(path))
    init = next(t for t in model.graph.initializer if t.name == initializer)
    old = numpy_helper.to_array(init)
    new = change(old).astype(old.dtype)
    init.CopyFrom(numpy_helper.from_array(new, init.name))
    onnx.save(model, str(path))
    reseal(export_dir, key)


def alter_torchscript_parameter(export_dir: Path, parameter: str) -> None:
    path = export_dir / "model.torchscript.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated
        module = torch.jit.load(str(path))
        with torch.no_grad():
            dict(module.named_parameters())[parameter].add_(0.5)
        torch.jit.save(module, str(path))
    reseal(export_dir, "torchscript")
