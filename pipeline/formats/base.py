"""The format contract and its registry.

A format is one module in this package that builds a `Format` and calls
`register()` once (as optimum registers one exporter config per
architecture). Everything format-specific is declared there: its key (the
`--format` choice and manifest key), its file name, archive suffix and
TorchServe handler, the name verify and bench give its in-process backend,
whether the C++ client runs it, `export(model, ctx) -> ArtifactRecord` and
`load(path, ...) -> Runner`. Export, verify, bench, archive, serve, the CLI's
choices and the Makefile ask the registry; none of them names a format.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime import runners
from pipeline_runtime.manifest import ArtifactRecord


@dataclass
class ExportContext:
    """What a format's exporter gets: the model's contract, its inputs, the settings.

    `cache` is shared by the formats of one export run: ONNX's fallback
    exporter reuses the TorchScript module instead of scripting the model twice.
    """

    entry: ZooEntry
    golden: Inputs
    probes: list[tuple[str, Inputs]]
    output_shapes: dict[str, tuple]
    out_dir: Path  # the staging folder the artifact is written into
    method: str = "auto"
    allow_unsafe_trace: bool = False
    opset: int = 18
    pt2_device: str = "cpu"
    atol: float = 1e-5
    rtol: float = 1e-4
    # False for a train-mode export, which is wrong on purpose (ExportConfig.train_mode):
    # the exporters' own checks against eager would refuse it.
    check: bool = True
    cache: dict[str, Any] = field(default_factory=dict)


Exporter = Callable[[nn.Module, ExportContext], ArtifactRecord]


@dataclass(frozen=True)
class Format:
    key: str  # --format choice and manifest artifact key: "onnx"
    title: str  # for people: "ONNX"
    file: str  # file name in the export folder: "model.onnx"
    archive_suffix: str  # <model>_<suffix>.mar: "onnx"
    handler: str  # TorchServe handler in handlers/: "onnx_handler.py"
    backend: str  # the in-process backend's name in verify and bench: "onnxruntime"
    export: Exporter
    default: bool = True  # exported without --format
    cpp: bool = False  # the LibTorch C++ client runs it
    description: str = ""

    def load(
        self,
        path: Path,
        *,
        inputs: list[str],
        outputs: list[str],
        device: str | torch.device = "cpu",
        threads: int | None = None,
        record: ArtifactRecord | None = None,
    ) -> runners.Runner:
        """The artifact as a Runner (named tensors in and out), through the serving runtime."""
        return runners.load(
            self.key,
            path,
            inputs=inputs,
            outputs=outputs,
            device=device,
            threads=threads,
            record=record.details if record else None,
        )


_REGISTRY: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format; its key, suffix, file and backend name must be new."""
    for other in _REGISTRY.values():
        for attr in ("key", "archive_suffix", "file", "backend"):
            if getattr(other, attr) == getattr(fmt, attr):
                raise ValueError(
                    f"format {fmt.key!r} reuses {attr} {getattr(fmt, attr)!r} of {other.key!r}"
                )
    if fmt.key not in runners.LOADERS:
        raise ValueError(f"format {fmt.key!r} has no loader in pipeline_runtime.runners.LOADERS")
    _REGISTRY[fmt.key] = fmt
    return fmt


def all_formats() -> tuple[Format, ...]:
    """Every registered format, in registration order (TorchScript, ONNX, .pt2)."""
    _load_builtin()
    order = list(_REGISTRY)  # a module may be imported before another: built-ins first, in order
    return tuple(
        sorted(
            _REGISTRY.values(),
            key=lambda f: (
                BUILTIN.index(f.key) if f.key in BUILTIN else len(BUILTIN) + order.index(f.key)
            ),
        )
    )


def keys() -> tuple[str, ...]:
    return tuple(f.key for f in all_formats())


def default_keys() -> tuple[str, ...]:
    return tuple(f.key for f in all_formats() if f.default)


def get(key: str) -> Format:
    _load_builtin()
    try:
        return _REGISTRY[key]
    except KeyError:
        raise ExportError(
            f"Unknown format {key!r}; use one of {', '.join(_REGISTRY)}, e.g. --format onnx."
        ) from None


def by_backend(name: str) -> Format | None:
    """The format whose in-process backend is `name` ("onnxruntime" → ONNX)."""
    return next((f for f in all_formats() if f.backend == name), None)


def by_suffix(suffix: str) -> Format | None:
    return next((f for f in all_formats() if f.archive_suffix == suffix), None)


BUILTIN = ("torchscript", "onnx", "pt2")  # the modules of the built-in formats, in order
_loaded = False


def _load_builtin() -> None:
    # The built-in formats register themselves on import; imported here, lazily,
    # so that `base` stays importable from each of them.
    global _loaded
    if not _loaded:
        _loaded = True
        for name in BUILTIN:
            importlib.import_module(f"pipeline.formats.{name}")
