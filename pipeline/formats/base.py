"""The format contract and its registry.

A format is one module that builds a `Format` and calls `register()` once (as
optimum registers one exporter config per architecture); the built-in ones are in
this package, and a test or a user registers one from anywhere. Everything
format-specific is declared there: its key (the `--format` choice and manifest key),
its file name and archive suffix, the runner kind that opens its file
(pipeline_runtime.formats: TorchScript, AOTInductor, ONNX Runtime), the name verify
and bench give its in-process backend, whether the C++ client runs it, how verify
localises a mismatch in it, and `export(model, ctx) -> ArtifactRecord`. Its
torch-free part, the descriptor (`Format.descriptor`), is what serving processes
know of it: loaders, the served platform and TorchServe's handler derive from it.
Export, verify, bench, archive, serve, the CLI's choices and the Makefile ask the
registry; none of them names a format.

The built-in formats' names (key, title, archive suffix, backend, default, cpp)
are also declared here, in `BUILTIN_FORMATS`, so that `keys()` and `declared()`
answer without importing a format module: `pipeline --help` builds its choices
from them without loading torch. `register()` refuses a built-in format whose
names differ from its declaration, so the two cannot drift apart.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.defaults import DEFAULT_ATOL, DEFAULT_RTOL
from pipeline.core.errors import ExportError
from pipeline_runtime import formats
from pipeline_runtime.manifest import ArtifactRecord

if TYPE_CHECKING:  # imported where used: this module stays importable without torch
    import torch
    from torch import nn

    from pipeline.zoo.spec import Inputs, ZooEntry
    from pipeline_runtime import runners

DEFAULT_OPSET = 18  # ONNX opset (pipeline.formats.onnx says why)
FLOAT32 = "float32"
PRECISIONS: tuple[str, ...] = (FLOAT32, "int8", "float16")
ALL = "all"  # --format all: every full-precision (float32) format
ALL_PRECISION = "precision"  # --format precision: every reduced-precision format
METHODS: tuple[str, ...] = ("auto", "trace", "script")  # TorchScript's --method choices


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
    opset: int = DEFAULT_OPSET
    pt2_device: str = "cpu"
    # Dynamic axes the torch.export-based formats compile at one size (--fix-axis seq=32).
    fix_axes: dict[str, int] = field(default_factory=dict)
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    # False for a train-mode export, which is wrong on purpose (ExportConfig.train_mode):
    # the exporters' own checks against eager would refuse it.
    check: bool = True
    cache: dict[str, Any] = field(default_factory=dict)
    # For the reduced-precision formats: their calibration data, built on first use
    # (pipeline.export.calibration.Calibration), and the budget they are judged against
    # (pipeline.core.budget.Budget).
    calibration: Callable[[], Any] | None = None
    budget: Any = None
    # A folder the export stage removes when it ends: intermediate files (the float
    # ONNX graph a quantiser starts from) that must not ship.
    scratch: Path | None = None
    # The fields of per-sample outputs (a detector's boxes, scores, labels), else empty: the
    # model handed to the exporter answers them collated (pipeline/formats/per_sample.py).
    per_sample: tuple[str, ...] = ()
    # The .pt2 formats' AOTInductor settings: {"changes": {...} on top of the built-in
    # ones, "from": where they came from} (pipeline/bench/pt2settings.py).
    pt2_settings: dict[str, Any] = field(default_factory=dict)


Exporter = Callable[["nn.Module", ExportContext], ArtifactRecord]


@dataclass(frozen=True)
class Format:
    key: str  # --format choice and manifest artifact key: "onnx"
    title: str  # for people: "ONNX"
    file: str  # file name in the export folder: "model.onnx"
    served_suffix: str  # served names are <model>_<suffix> (digits_lenet_onnx)
    runner: str  # what opens the file (pipeline_runtime.formats.RUNNERS): "onnxruntime"
    backend: str  # the in-process backend's name in verify and bench: "onnxruntime"
    export: Exporter
    default: bool = True  # exported without --format
    cpp: bool = False  # the LibTorch C++ client runs it
    description: str = ""
    # Written and run through `torch.jit`, which a torch past TorchScript's sunset refuses
    # (pipeline_runtime/jitgate.py): then left out of the defaults and of --format all.
    needs_jit: bool = False
    # The Open Inference Protocol's model metadata `platform` (Triton's name where it
    # has one: "onnxruntime_onnx", "pytorch_libtorch").
    platform: str = ""
    # What its numbers are computed in. "float32" formats must match eager elementwise;
    # the others (int8, float16) change the numbers on purpose and are judged by what
    # the model still gets right (pipeline/export/quality.py).
    precision: str = FLOAT32
    # How verify localises a mismatch in it (pipeline.verify.localise): "onnx" (the ONNX
    # graph's values, node by node), "torchscript" (its graph's calls), or "" with
    # `not_localised` saying why not (or a generic sentence).
    localiser: str = ""
    not_localised: str = ""
    # False for an on-device format (.pte): export, verify and bench take it; no runtime
    # archives, deploys or serves it (pipeline_runtime.formats.Descriptor.served).
    served: bool = True
    # A C++ program of its own that runs it without LibTorch (the .pte runner): the module
    # that builds and runs it (`ensure_built()`, `run(model, cases)`), or "" for none.
    native: str = ""
    # What it needs that the core install may lack: None when it can be written here, else
    # one sentence saying what to install (--format all then leaves it out, saying so).
    missing: Callable[[], str | None] | None = None

    @property
    def descriptor(self) -> formats.Descriptor:
        """Its torch-free part, what a serving process knows of it."""
        return formats.Descriptor(
            self.key,
            self.file,
            self.runner,
            self.precision,
            self.cpp,
            self.platform,
            self.served,
        )

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
        from pipeline_runtime import runners

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
    """Add a format; its key, suffix, file and backend name must be new, a built-in
    format's names must be the ones `BUILTIN_FORMATS` declares and its descriptor the one
    pipeline_runtime.formats ships; another format's descriptor is made known to this
    process (and its export writes it into the manifest for the serving processes)."""
    names = next((d for d in BUILTIN_FORMATS if d.key == fmt.key), None)
    if names is not None and names != Declared.of(fmt):
        raise ValueError(
            f"format {fmt.key!r} registers {Declared.of(fmt)}, but pipeline/formats/base.py "
            f"declares {names}: change both"
        )
    for other in _REGISTRY.values():
        for attr in ("key", "served_suffix", "file", "backend"):
            if getattr(other, attr) == getattr(fmt, attr):
                raise ValueError(
                    f"format {fmt.key!r} reuses {attr} {getattr(fmt, attr)!r} of {other.key!r}"
                )
    if fmt.key in formats.BUILTIN and formats.BUILTIN[fmt.key] != fmt.descriptor:
        raise ValueError(
            f"format {fmt.key!r} registers {fmt.descriptor}, but pipeline_runtime/formats.py "
            f"describes {formats.BUILTIN[fmt.key]}: change both"
        )
    if fmt.key not in formats.BUILTIN:
        formats.add(fmt.descriptor)  # checks the runner kind
    _REGISTRY[fmt.key] = fmt
    return fmt


def unregister(key: str) -> None:
    """Remove a format registered at run time (tests' own formats)."""
    if key in BUILTIN:
        raise ValueError(f"{key!r} is built in")
    _REGISTRY.pop(key, None)
    formats.remove(key)


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


def declared() -> tuple[Declared | Format, ...]:
    """Every format's names, in `all_formats()` order, without importing a format module
    (or torch): the built-ins as `BUILTIN_FORMATS` declares them, then any other
    format registered so far. What the CLI's choices and help are built from."""
    return (*BUILTIN_FORMATS, *(f for f in _REGISTRY.values() if f.key not in BUILTIN))


def keys() -> tuple[str, ...]:
    return tuple(f.key for f in declared())


def default_keys() -> tuple[str, ...]:
    return tuple(f.key for f in declared() if f.default)


def without_jit(keys: tuple[str, ...], *, defaults: bool = False) -> tuple[str, ...]:
    """`keys` for a torch that refuses `torch.jit`: the formats that need it left out and,
    for the defaults, the C++ formats that do not (.pt2) in their place, so that the C++
    client still has a default format to run."""
    kept = [f for f in declared() if f.key in keys and not f.needs_jit]
    if defaults and len(kept) < len(keys):
        kept += [f for f in declared() if f.cpp and not f.needs_jit and f.precision == FLOAT32]
    return tuple(f.key for f in declared() if f in kept)


def served_keys() -> tuple[str, ...]:
    """The formats a runtime may serve (every one but the on-device ones)."""
    return tuple(f.key for f in declared() if f.served)


def full_precision_keys() -> tuple[str, ...]:
    """What `--format all` writes: every float32 format. Reduced-precision formats change
    the numbers on purpose and need calibration data, so they are asked for by name or
    with `--format precision`."""
    return tuple(f.key for f in declared() if f.precision == FLOAT32)


def reduced_precision_keys() -> tuple[str, ...]:
    """What `--format precision` writes: every int8 and float16 format."""
    return tuple(f.key for f in declared() if f.precision != FLOAT32)


def precision_of(key: str | None) -> str:
    """The precision of format `key` (float32 for an unknown or missing key)."""
    found = next((f for f in declared() if f.key == key), None)
    return found.precision if found is not None else FLOAT32


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
    return next((f for f in all_formats() if f.served_suffix == suffix), None)


@dataclass(frozen=True)
class Declared:
    """A format's names: what `Format` holds besides its code and files."""

    key: str
    title: str
    served_suffix: str
    backend: str
    default: bool = True
    cpp: bool = False
    precision: str = FLOAT32
    needs_jit: bool = False
    served: bool = True

    @classmethod
    def of(cls, fmt: Format) -> Declared:
        return cls(
            fmt.key,
            fmt.title,
            fmt.served_suffix,
            fmt.backend,
            fmt.default,
            fmt.cpp,
            fmt.precision,
            fmt.needs_jit,
            fmt.served,
        )


# The built-in formats, in order; each is pipeline/formats/<key>.py, which registers
# a Format with these names (register() checks). Everything else about a format is
# declared in its module only.
BUILTIN_FORMATS = (
    Declared("torchscript", "TorchScript", "ts", "torchscript", cpp=True, needs_jit=True),
    Declared("onnx", "ONNX", "onnx", "onnxruntime"),
    # Opt-in: AOTInductor compiles C++ for each model (tens of seconds on a small CPU).
    Declared("pt2", ".pt2 (AOTInductor)", "pt2", "pt2", default=False, cpp=True),
    # Reduced precision (issue 29): opt-in, judged at task level, one module each.
    Declared(
        "onnx_int8_static",
        "ONNX int8 (static, QDQ)",
        "onnx_int8s",
        "onnxruntime_int8_static",
        default=False,
        precision="int8",
    ),
    Declared(
        "onnx_int8_dynamic",
        "ONNX int8 (dynamic)",
        "onnx_int8d",
        "onnxruntime_int8_dynamic",
        default=False,
        precision="int8",
    ),
    Declared(
        "onnx_fp16",
        "ONNX float16",
        "onnx_fp16",
        "onnxruntime_fp16",
        default=False,
        precision="float16",
    ),
    Declared(
        "pt2_int8",
        ".pt2 int8 (torchao)",
        "pt2_int8",
        "pt2_int8",
        default=False,
        cpp=True,
        precision="int8",
    ),
    # On device (issue 53): ExecuTorch's program, XNNPACK-delegated; verified in ExecuTorch's
    # Python runtime and its C++ runner, never served. Opt-in: lowering takes seconds.
    Declared("pte", "ExecuTorch .pte", "pte", "executorch", default=False, served=False),
    Declared(
        "pte_int8",
        "ExecuTorch .pte int8",
        "pte_int8",
        "executorch_int8",
        default=False,
        precision="int8",
        served=False,
    ),
)
BUILTIN = tuple(d.key for d in BUILTIN_FORMATS)  # the modules of the built-in formats
_loaded = False


def _load_builtin() -> None:
    # The built-in formats register themselves on import; imported here, lazily,
    # so that `base` stays importable from each of them.
    global _loaded
    if not _loaded:
        _loaded = True
        for name in BUILTIN:
            importlib.import_module(f"pipeline.formats.{name}")
