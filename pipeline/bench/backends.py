"""The in-process backends bench measures for one export, built from the format registry.

Each format the export holds is loaded the one way every stage loads it
(`ExportedModel.load`, the serving runtime's Runner) and timed under the
format's backend name. On top of those, bench adds what only a benchmark
asks about: eager PyTorch as the baseline, the TorchScript module frozen
and optimised for inference, the ONNX model converted to other opsets, and
the C++ client on every format it runs (named as verify names it).
"""

from __future__ import annotations

import importlib
import re
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.bench.inprocess import Runner, skipped, timed
from pipeline.core.noise import library_warnings
from pipeline.export.opened import ExportedModel, open_export
from pipeline.formats import base as registry
from pipeline.formats.cpp import is_pt2

SEED = 0
EAGER = "eager"
# Outputs of an opset conversion must match the exported model's this closely.
OPSET_ATOL, OPSET_RTOL = 1e-5, 1e-4


def _torch_settings(threads: int) -> dict[str, Any]:
    return {"intra_op_threads": threads, "inter_op_threads": torch.get_num_interop_threads()}


def format_runner(
    exported: ExportedModel, fmt: registry.Format, args: list[torch.Tensor], threads: int
) -> tuple[Runner, Any]:
    """FMT's artifact timed in-process under its backend name, and the loaded runtime Runner.

    A format that cannot run on this CPU (a package compiled for CUDA, a load
    or first call that fails) comes back as a skipped backend saying why, and
    no runtime Runner.
    """
    device = exported.manifest.artifact(fmt.key).get("device", "cpu")
    if device != "cpu":  # the bench compares CPU backends
        return skipped(fmt.backend, f"the package was compiled for {device}"), None
    try:
        loaded = exported.load(fmt.key, threads=threads)
        loaded.positional(*args)  # a first call: lazy initialisation, and it must run here
    except Exception as err:  # noqa: BLE001 - an artifact that cannot run here is left out
        return skipped(fmt.backend, err), None
    settings = _torch_settings(threads) | loaded.settings
    path = exported.path(fmt.key)
    if is_pt2(path):
        settings["omp_kernel_threads"] = pt2_kernel_threads(path)
    runner = Runner(
        fmt.backend,
        timed(lambda: loaded.positional(*args), threads),
        settings,
        format=fmt.key,
        verified_as=fmt.backend,
    )
    return runner, loaded


def format_runners(exported: ExportedModel, batch: int, threads: int) -> dict[str, Runner]:
    """Only the formats' own backends (no eager, no extras), by backend name."""
    args = list(exported.sample(batch, seed=SEED).values())
    return {f.backend: format_runner(exported, f, args, threads)[0] for f in exported.formats()}


def runners(
    export: ExportedModel | Path,
    batch: int,
    threads: int,
    cpp_binary: Path | None = None,
    opsets: tuple[int, ...] = (),
) -> dict[str, Runner]:
    """eager, each format's backend, and the extras (frozen TorchScript, ONNX in other
    `opsets` once their outputs match the exported model's, and with a binary the C++
    client on each format it runs), all on one input of `batch` samples."""
    exported = export if isinstance(export, ExportedModel) else open_export(Path(export))
    inputs = exported.sample(batch, seed=SEED)
    args = list(inputs.values())
    model = exported.model
    first = exported.formats()[0].key if exported.formats() else None
    out: dict[str, Runner] = {
        # Eager has no artifact: serving it means serving the export's first format.
        EAGER: Runner(
            EAGER,
            timed(lambda: model(*args), threads),
            _torch_settings(threads),
            format=first,
            verified_as=EAGER,
        )
    }
    for fmt in exported.formats():
        runner, loaded = format_runner(exported, fmt, args, threads)
        out[runner.name] = runner
        if loaded is None:
            continue
        if getattr(loaded.call, "module", None) is not None:  # a TorchScript module
            out.update(_frozen(fmt, loaded.call.module, args, runner, threads))
        # An ONNX Runtime session of a float32 graph: int8/float16 graphs are not converted
        # (the opset comparison is about the exporter's choice of opset, not precision).
        if getattr(loaded.call, "session", None) is not None and fmt.precision == registry.FLOAT32:
            for opset in opsets:
                out.update(_converted(exported, fmt, opset, args, loaded, runner, threads))
    if cpp_binary is not None:
        from pipeline.verify.backends import cpp_backend_name

        for fmt in (f for f in exported.formats() if f.cpp):
            name = cpp_backend_name(fmt)
            out[name] = Runner(
                name,
                _cpp_measure(
                    exported.path(fmt.key),
                    args,
                    cpp_binary,
                    threads,
                    exported.manifest.artifact(fmt.key).get("op_libraries") or (),
                ),
                {"intra_op_threads": threads, "libtorch": "same wheel"},
                format=fmt.key,
                verified_as=name,
            )
    for fmt in (f for f in exported.formats() if f.native and cpp_binary is not None):
        # the format's own runner, without LibTorch (asked for with the C++ client's rows)
        from pipeline.verify.backends import cpp_backend_name

        name = cpp_backend_name(fmt)
        runner = importlib.import_module(fmt.native)
        out[name] = Runner(
            name,
            _cpp_measure(exported.path(fmt.key), args, runner.ensure_built(), threads, (), runner),
            {"runtime": fmt.native, "libtorch": "none"},
            format=fmt.key,
            verified_as=name,
        )
    return out


def _frozen(
    fmt: registry.Format, module: Any, args: list[torch.Tensor], plain: Runner, threads: int
) -> dict[str, Runner]:
    """The TorchScript module frozen (weights inlined, conv+bn folded) and optimised.

    `torch.jit.freeze` works on a copy, so the plain backend keeps its module.
    Scripted control flow may refuse it; then the backend is left out, saying why.
    """
    name = f"{fmt.backend}_frozen"
    try:
        # torch.jit's deprecation FutureWarning (see DESIGN.md): -v only.
        with library_warnings("torch.jit.freeze", FutureWarning):
            frozen = torch.jit.optimize_for_inference(torch.jit.freeze(module.eval()))
            with torch.inference_mode():
                frozen(*args)
    except Exception as err:  # noqa: BLE001 - any failure just leaves this backend out
        return {name: skipped(name, err)}
    settings = {**plain.settings, "optimize_for_inference": True}
    measure = timed(lambda: frozen(*args), threads)  # timed() runs it under inference_mode
    return {name: Runner(name, measure, settings, fmt.key, plain.verified_as)}


def _converted(
    exported: ExportedModel,
    fmt: registry.Format,
    opset: int,
    args: list[torch.Tensor],
    loaded: Any,
    plain: Runner,
    threads: int,
) -> dict[str, Runner]:
    """The exported ONNX model in another opset (onnx's version converter), loaded as the
    exported one is (same session options, same call), once its outputs match it."""
    import onnx
    from onnx import version_converter

    name = f"{fmt.backend} (opset {opset})"
    try:
        converted = version_converter.convert_version(onnx.load(str(exported.path(fmt.key))), opset)
        with tempfile.TemporaryDirectory(prefix="pipeline-opset-") as tmp:
            path = Path(tmp) / f"opset{opset}.onnx"
            path.write_bytes(converted.SerializeToString())
            other = fmt.load(
                path,
                inputs=loaded.input_names,
                outputs=loaded.output_names,
                threads=threads,
            )  # the session holds the model in memory: the file may go
        expected = loaded(dict(zip(loaded.input_names, args, strict=True)))
        got = other(dict(zip(other.input_names, args, strict=True)))
        if not all(
            torch.allclose(got[k], v, atol=OPSET_ATOL, rtol=OPSET_RTOL) for k, v in expected.items()
        ):
            raise ValueError("its outputs differ from the exported model's")
    except Exception as err:  # noqa: BLE001 - a converter or runtime refusal leaves it out
        return {name: skipped(name, err)}
    settings = {**plain.settings, "opset": opset, "verified": "against the exported ONNX"}
    measure = timed(lambda: other.positional(*args), threads)
    return {name: Runner(name, measure, settings, fmt.key, plain.verified_as)}


def _cpp_measure(
    model: Path,
    args: list[torch.Tensor],
    binary: Path,
    threads: int,
    op_libraries: Sequence[str] = (),
    program: Any = None,
) -> Callable[[int, int], dict[str, float]]:
    """A measure() running the C++ client: one round is one client run, which times
    `repeat` calls itself (no process start-up in the figures). Each run is a new
    process, so it always warms up at least once: its first call is a cold start.
    `op_libraries`: the record's custom-op libraries (torchvision), loaded first.
    `program`: the module that runs it (default the LibTorch client's, pipeline.formats.cpp;
    a format's own runner, pipeline.formats.pte_runner)."""

    def measure(warmup: int, repeat: int) -> dict[str, float]:
        from pipeline.formats import cpp

        stats = (
            (program or cpp)
            .run(
                model,
                [args],
                binary=binary,
                threads=threads,
                warmup=max(warmup, 1),
                repeat=repeat,
                op_libraries=op_libraries,
            )
            .stats
        )
        return {k: float(stats[k]) for k in ("p50_ms", "p90_ms", "p99_ms")} | {"runs": repeat}

    return measure


def pt2_kernel_threads(path: Path) -> str:
    """How the package's OpenMP loops pick their thread count, read from its C++ sources.

    Inductor writes `#pragma omp parallel` (which follows torch.set_num_threads
    in the calling thread) when torch's thread count at compile time equals
    os.cpu_count(), and `num_threads(N)` fixed otherwise, e.g. on a machine
    with SMT where torch defaults to the physical cores (torch/_inductor/
    codegen/cpp.py, WorkSharing.parallel). Convolutions and GEMMs the package
    hands back to ATen follow torch.set_num_threads either way.
    """
    pragmas: list[str] = []
    with zipfile.ZipFile(path) as package:
        sources = [n for n in package.namelist() if n.endswith(".cpp")]
        for name in sources:
            text = package.read(name).decode(errors="replace")
            pragmas += re.findall(r"#pragma omp parallel(?: num_threads\((\d+)\))?", text)
    if not sources:
        return "unknown (no C++ sources in the package)"
    if not pragmas:
        return "none (serial loops)"
    fixed = sorted({n for n in pragmas if n}, key=int)
    if fixed:
        return f"fixed at compile time: {', '.join(fixed)}"
    return "torch.set_num_threads"
