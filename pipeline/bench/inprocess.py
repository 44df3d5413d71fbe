"""In-process backends measured side by side, in interleaved rounds.

Every backend runs the same inputs (drawn once from the model's input spec).
A round measures each backend in turn, the order rotating from round to
round, so a noisy neighbour or a turbo change slows them all alike and the
ratios between them hold even when absolute figures drift. Each backend's
thread settings are explicit and recorded.
"""

from __future__ import annotations

import logging
import re
import statistics
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.manifest import artifact_path, read_manifest
from pipeline.verify import load_reference

log = logging.getLogger(__name__)

SEED = 0
# Fewest timed calls per backend and round when the time budget scales them down.
# Two, not five: resnet18 at batch 32 (seven backends, over a second a call) then
# gets two or three interleaved rounds in the budget; with five it got one round,
# in which a noisy moment lands on whichever backend it happens to hit.
MIN_RUNS = 2
# Warm-up stops after this long (at least MIN_WARMUP calls): ten warm-up calls of
# resnet18 at batch 32 took over ten seconds per backend. Two calls cover
# TorchScript's profiling run and the optimised graph it compiles on the second.
WARMUP_S = 2.0
MIN_WARMUP = 2


@dataclass
class Cell:
    model: str
    backend: str
    batch: int
    threads: int
    runs: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    throughput: float  # samples per second at the median latency
    gflops: float | None = None
    peak_fraction: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Runner:
    """One backend: `measure(warmup, repeat)` returns one round's latency statistics (ms)."""

    name: str
    measure: Callable[[int, int], dict[str, float]]
    settings: dict[str, Any] = field(default_factory=dict)


def _stats(times_ms: list[float]) -> dict[str, float]:
    arr = np.asarray(times_ms)
    return {
        "runs": len(times_ms),
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "p99_ms": float(np.percentile(arr, 99)),
    }


def timed(fn: Callable[[], Any], threads: int | None = None) -> Callable[[int, int], dict]:
    """A measure() for a Python callable: `warmup` untimed calls (fewer when they pass
    WARMUP_S), then `repeat` timed ones."""

    def measure(warmup: int, repeat: int) -> dict[str, float]:
        previous = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                start = time.perf_counter()
                for i in range(warmup):
                    if i >= MIN_WARMUP and time.perf_counter() - start > WARMUP_S:
                        break
                    fn()
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
        finally:
            torch.set_num_threads(previous)
        return _stats(times)

    return measure


def model_flops(model: torch.nn.Module, inputs: list[torch.Tensor]) -> int:
    """FLOPs of one forward pass (matmuls and convolutions), by torch's flop counter."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        model(*inputs)
    return int(counter.get_total_flops())


def runners(
    export_dir: Path,
    batch: int,
    threads: int,
    cpp_binary: Path | None = None,
    opsets: tuple[int, ...] = (),
) -> dict[str, Runner]:
    """eager, torchscript, torchscript_frozen, onnxruntime, pt2 (when exported) and, with
    a binary, the C++ client on each format it runs (cpp, cpp/pt2), on one input.

    `opsets`: the exported ONNX model converted to other opsets, each an extra
    backend `onnxruntime (opset N)` once its outputs match the exported one's.
    """
    import onnxruntime as ort

    from pipeline.verify.backends import ort_session_options

    manifest = read_manifest(export_dir)
    entry, model = load_reference(export_dir, manifest)
    inputs = entry.sample_inputs(entry.sizes(batch=batch), torch.Generator().manual_seed(SEED))
    args = list(inputs.values())
    torch_settings = {
        "intra_op_threads": threads,
        "inter_op_threads": torch.get_num_interop_threads(),
    }
    out: dict[str, Runner] = {
        "eager": Runner("eager", timed(lambda: model(*args), threads), torch_settings)
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ts_path = artifact_path(export_dir, manifest, "torchscript")
        scripted = torch.jit.load(str(ts_path), map_location="cpu").eval()
        out["torchscript"] = Runner(
            "torchscript", timed(lambda: scripted(*args), threads), torch_settings
        )
        try:
            # Freezing inlines weights and folds constants (conv+bn); scripted
            # control flow may refuse it, and then the backend is left out.
            frozen = torch.jit.optimize_for_inference(
                torch.jit.freeze(torch.jit.load(str(ts_path), map_location="cpu").eval())
            )
            frozen(*args)
            out["torchscript_frozen"] = Runner(
                "torchscript_frozen",
                timed(lambda: frozen(*args), threads),
                {**torch_settings, "optimize_for_inference": True},
            )
        except Exception as err:  # noqa: BLE001 - any failure just leaves this backend out
            out["torchscript_frozen"] = Runner(
                "torchscript_frozen", _skipped, {"skipped": f"{type(err).__name__}: {err}"[:200]}
            )
    opts = ort_session_options(threads)
    session = ort.InferenceSession(
        str(artifact_path(export_dir, manifest, "onnx")), opts, providers=["CPUExecutionProvider"]
    )
    feeds = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}  # by name, as verify
    out["onnxruntime"] = Runner(
        "onnxruntime",
        timed(lambda: session.run(None, feeds)),
        {
            "intra_op_threads": opts.intra_op_num_threads,
            "inter_op_threads": opts.inter_op_num_threads,
            # Spinning off: ORT's spin-waiting threads starve PyTorch in the same process.
            "allow_spinning": "0",
        },
    )
    for opset in opsets:
        name = f"onnxruntime (opset {opset})"
        try:
            other = _converted_session(artifact_path(export_dir, manifest, "onnx"), opset, opts)
            expected = session.run(None, feeds)
            got = other.run(None, feeds)
            if not all(
                np.allclose(g, e, atol=1e-5, rtol=1e-4) for g, e in zip(got, expected, strict=True)
            ):
                raise ValueError("its outputs differ from the exported model's")
            out[name] = Runner(
                name,
                timed(lambda other=other: other.run(None, feeds)),
                {
                    **out["onnxruntime"].settings,
                    "opset": opset,
                    "verified": "against the exported ONNX",
                },
            )
        except Exception as err:  # noqa: BLE001 - a converter or runtime refusal leaves it out
            out[name] = Runner(name, _skipped, {"skipped": f"{type(err).__name__}: {err}"[:200]})
    if "pt2" in manifest["artifacts"]:
        out["pt2"] = pt2_runner(export_dir, manifest, args, threads)
    if cpp_binary is not None:
        from pipeline.verify.backends import CPP_ARTIFACTS

        for artifact in (a for a in CPP_ARTIFACTS if a in manifest["artifacts"]):
            name = "cpp" if artifact == "torchscript" else f"cpp/{artifact}"  # as verify names it
            out[name] = Runner(
                name,
                _cpp_measure(
                    artifact_path(export_dir, manifest, artifact), args, cpp_binary, threads
                ),
                {"intra_op_threads": threads, "libtorch": "same wheel"},
            )
    return out


def _cpp_measure(
    model: Path, args: list[torch.Tensor], binary: Path, threads: int
) -> Callable[[int, int], dict[str, float]]:
    """A measure() running the C++ client: one round is one client run, which times
    `repeat` calls itself (no process start-up in the figures). Each run is a new
    process, so it always warms up at least once: its first call is a cold start."""

    def measure(warmup: int, repeat: int) -> dict[str, float]:
        from pipeline.cpp import run as run_cpp

        stats = run_cpp(
            model, [args], binary=binary, threads=threads, warmup=max(warmup, 1), repeat=repeat
        ).stats
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


def pt2_runner(
    export_dir: Path, manifest: dict[str, Any], args: list[torch.Tensor], threads: int
) -> Runner:
    """The AOTInductor package in-process, or a skipped backend saying why not."""
    from pipeline.export.pt2_export import load_package

    args = [a.contiguous() for a in args]  # the package checks strides against the exported ones
    device = manifest["artifacts"]["pt2"].get("device", "cpu")
    if device != "cpu":  # the bench compares CPU backends
        return Runner("pt2", _skipped, {"skipped": f"the package was compiled for {device}"})
    try:
        path = artifact_path(export_dir, manifest, "pt2")
        package = load_package(path, "cpu")
        with torch.inference_mode():
            package(*args)
        kernel_threads = pt2_kernel_threads(path)
    except Exception as err:  # noqa: BLE001 - a package that cannot run here is left out
        why = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        return Runner("pt2", _skipped, {"skipped": why})
    return Runner(
        "pt2",
        timed(lambda: package(*args), threads),
        {
            "intra_op_threads": threads,
            "inter_op_threads": torch.get_num_interop_threads(),
            "omp_kernel_threads": kernel_threads,
        },
    )


def _converted_session(path: Path, opset: int, opts: Any) -> Any:
    """The exported ONNX model in another opset (onnx's version converter), as a session."""
    import onnx
    import onnxruntime as ort
    from onnx import version_converter

    converted = version_converter.convert_version(onnx.load(str(path)), opset)
    return ort.InferenceSession(
        converted.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )


def _skipped(warmup: int, repeat: int) -> dict[str, float]:
    raise RuntimeError("skipped")


def measure_interleaved(
    runners: dict[str, Runner],
    *,
    warmup: int,
    repeat: int,
    rounds: int,
    time_budget_s: float | None = None,
) -> dict[str, list[dict[str, float]]]:
    """Per backend, one statistics dict per round; skipped backends are left out.

    With a time budget, a backend whose calls are slow (resnet18 at batch 32:
    about a second) runs fewer than `repeat` calls a round, never fewer than
    MIN_RUNS, so that the `rounds` fit in the budget: several interleaved
    rounds of fewer calls, rather than one long round that the budget ends.
    The budget is checked between rounds, so at the MIN_RUNS floor fewer
    rounds may run.

    A backend that fails (the C++ client refusing a format, say) is skipped from
    then on: its `settings["skipped"]` says why, and the others go on.
    """
    live = {n: r for n, r in runners.items() if "skipped" not in r.settings}
    call_s: dict[str, float] = {}
    for name in list(live):
        first = _run_or_skip(live, name, warmup, 1)  # lazy init etc. outside the rounds
        if first is not None:
            call_s[name] = first["p50_ms"] / 1e3
    names = list(live)
    runs = {n: repeat for n in names}
    if time_budget_s is not None and names:
        share_s = time_budget_s / rounds / len(names)
        floor = min(repeat, MIN_RUNS)
        runs = {n: max(floor, min(repeat, int(share_s / max(call_s[n], 1e-9)))) for n in names}
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    start = time.monotonic()
    for k in range(rounds if names else 0):
        order = names[k % len(names) :] + names[: k % len(names)]
        for name in (n for n in order if n in live):
            stats = _run_or_skip(live, name, 0, runs[name])
            if stats is not None:
                results[name].append(stats)
        if time_budget_s is not None and time.monotonic() - start > time_budget_s:
            break
    return {n: results[n] for n in names if n in live}


def _run_or_skip(
    live: dict[str, Runner], name: str, warmup: int, repeat: int
) -> dict[str, float] | None:
    try:
        return live[name].measure(warmup, repeat)
    except Exception as err:  # noqa: BLE001 - one failing backend must not end the bench
        why = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        log.warning("%s failed and is left out: %s", name, why)
        live.pop(name).settings["skipped"] = why
        return None


def cells(
    model: str,
    batch: int,
    threads: int,
    rounds: dict[str, list[dict[str, float]]],
    flops: int | None,
    peak_gflops: float | None,
    settings: dict[str, dict],
) -> list[Cell]:
    """One Cell per backend: the median over rounds of each round's statistics."""
    out = []
    for backend, per_round in rounds.items():
        median = statistics.median(r["p50_ms"] for r in per_round)
        gflops = flops / (median / 1e3) / 1e9 if flops else None
        out.append(
            Cell(
                model=model,
                backend=backend,
                batch=batch,
                threads=threads,
                runs=int(sum(r["runs"] for r in per_round)),
                median_ms=median,
                p90_ms=statistics.median(r["p90_ms"] for r in per_round),
                p99_ms=statistics.median(r["p99_ms"] for r in per_round),
                throughput=batch / (median / 1e3),
                gflops=gflops,
                peak_fraction=gflops / peak_gflops if gflops and peak_gflops else None,
                settings={**settings.get(backend, {}), "rounds": len(per_round)},
            )
        )
    return out
