"""Build and run the LibTorch C++ client (cpp_client/) from Python.

The client runs TorchScript files and AOTInductor `.pt2` packages with the
same flags and output; `run()` and `compare_latency()` take either.

The client links the LibTorch inside the pinned torch wheel. That wheel is a
CUDA build, so its CMake config needs the CUDA toolkit and the wheel's own
nvrtc (../shared/DESIGN.md); `build()` finds them and fails with a message
saying what to install when something is missing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import PipelineError
from pipeline_runtime import oplibs
from pipeline_runtime.runners import aoti_load

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parents[2] / "cpp_client"
DEFAULT_BUILD_DIR = SOURCE_DIR / "build"
BINARY = "run_torchscript"
CUDA_ROOTS = ("/usr/local/cuda",)


class CppError(PipelineError):
    """The C++ client could not be built or failed to run."""


def _nvrtc() -> Path | None:
    """libnvrtc from the wheel's nvidia-* packages (the toolkit's may be another version)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for candidate in sorted(Path(root).glob("cu*/lib/libnvrtc.so*")) + sorted(
            Path(root).glob("cuda_nvrtc/lib/libnvrtc.so*")
        ):
            if "builtins" not in candidate.name and "alt" not in candidate.name:
                return candidate
    return None


def cmake_args() -> list[str]:
    """The -D flags the wheel's LibTorch needs on this machine."""
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", "-DCMAKE_BUILD_TYPE=Release"]
    if torch.version.cuda is None:  # a CPU-only wheel needs nothing more
        return args
    cuda_root = os.environ.get("CUDA_HOME") or next(
        (r for r in CUDA_ROOTS if Path(r, "bin", "nvcc").exists()), None
    )
    if cuda_root is None:
        raise CppError(
            f"The installed torch {torch.__version__} is a CUDA {torch.version.cuda} build, and its "
            "LibTorch CMake config needs the CUDA toolkit even for a CPU-only client, but no nvcc "
            f"was found (looked in $CUDA_HOME and {', '.join(CUDA_ROOTS)}). Install the CUDA "
            f"{torch.version.cuda.split('.')[0]} toolkit (for example Debian/Ubuntu's cuda-toolkit "
            "package from NVIDIA's repository) or set CUDA_HOME to it."
        )
    nvrtc = _nvrtc()
    if nvrtc is None:
        raise CppError(
            "libnvrtc was not found in the torch wheel's nvidia packages; reinstall torch with "
            "`make venv` (pip installs nvidia-cuda-nvrtc with it)."
        )
    # No GPU here to probe: name the architectures instead of letting
    # LibTorch's config try (and warn) to detect one.
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    return [
        *args,
        f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_root}",
        f"-DCUDA_nvrtc_LIBRARY={nvrtc}",
        f"-DCUDA_NVRTC_LIB={nvrtc}",
        f"-DTORCH_CUDA_ARCH_LIST={arch}",
    ]


def binary_path(build_dir: Path | None = None) -> Path:
    return Path(build_dir or DEFAULT_BUILD_DIR) / BINARY


def build(build_dir: Path | None = None, jobs: int | None = None) -> Path:
    """Configure and build the client (incrementally); returns the executable."""
    build_dir = Path(build_dir or DEFAULT_BUILD_DIR)
    if shutil.which("cmake") is None:
        raise CppError(
            "cmake is not installed; install CMake 3.18 or newer (Debian: apt-get install cmake g++)."
        )
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise CppError("No C++ compiler found; install g++ (Debian: apt-get install g++).")
    build_dir.mkdir(parents=True, exist_ok=True)
    steps = [
        ["cmake", "-S", str(SOURCE_DIR), "-B", str(build_dir), *cmake_args()],
        ["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2)],
    ]
    for cmd in steps:
        log.info("%s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            text = (proc.stderr or "") + (proc.stdout or "")
            errors = [ln for ln in text.splitlines() if "rror" in ln][:15]
            raise CppError(
                f"Building the C++ client failed at `{' '.join(cmd[:3])}`:\n"
                + "\n".join(errors or text.splitlines()[-20:])
            )
    binary = binary_path(build_dir)
    if not binary.is_file():
        raise CppError(f"The build finished but {binary} is missing.")
    return binary


def ensure_built(build_dir: Path | None = None) -> Path:
    """The executable, building it first when it is missing or older than its sources."""
    binary = binary_path(build_dir)
    sources = [
        p
        for p in SOURCE_DIR.rglob("*")
        if p.suffix in (".cpp", ".h", ".txt") and "build" not in p.relative_to(SOURCE_DIR).parts
    ]
    if binary.is_file() and all(p.stat().st_mtime <= binary.stat().st_mtime for p in sources):
        return binary
    return build(build_dir)


@dataclass(frozen=True)
class CppRun:
    outputs: list[list[torch.Tensor]]  # per case, the flattened outputs
    stats: dict[str, Any]  # latency statistics printed by the client


def run(
    model: Path,
    cases: list[list[torch.Tensor]],
    *,
    binary: Path | None = None,
    device: str = "cpu",
    threads: int | None = None,
    warmup: int = 0,
    repeat: int = 1,
    timeout: float = 600,
    op_libraries: Sequence[str] = (),
) -> CppRun:
    """Run the client on `cases` (each a list of input tensors in forward order).

    `op_libraries`: the artifact record's `op_libraries` (["torchvision"]); the
    client dlopens the shared libraries they need (`--load-library`) before the model.
    """
    binary = Path(binary or ensure_built())
    try:
        libraries = oplibs.cpp_library_paths(op_libraries)
    except oplibs.OpLibraryError as err:
        raise CppError(f"Cannot run {model} from C++: {err}") from None
    with tempfile.TemporaryDirectory(prefix="pipeline-cpp-") as tmp:
        inputs, outputs = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
        # clone(): a tensor torch.export touched carries Python attributes LibTorch cannot unpickle.
        torch.save([[t.detach().cpu().clone() for t in case] for case in cases], inputs)
        cmd = [str(binary), "--model", str(model), "--inputs", str(inputs), "--outputs", str(outputs),
               "--device", device, "--warmup", str(warmup), "--repeat", str(repeat)]  # fmt: skip
        if threads:
            cmd += ["--threads", str(threads)]
        for library in libraries:
            cmd += ["--load-library", str(library)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            how = (
                f"was killed by {signal.Signals(-proc.returncode).name}"  # e.g. a crash: SIGSEGV
                if proc.returncode < 0
                else f"exited {proc.returncode}"
            )
            raise CppError(f"{BINARY} {how}: {proc.stderr.strip()[-600:]}")
        result = torch.load(outputs, map_location="cpu", weights_only=True)
    return CppRun(
        outputs=[list(case) for case in result],
        stats=json.loads(proc.stdout.strip().splitlines()[-1]),
    )


def is_pt2(model: Path) -> bool:
    """Whether the client runs MODEL as an AOTInductor package (its own rule, in inference.cpp)."""
    model = Path(model)
    if model.suffix == ".pt2":
        return True
    try:
        with zipfile.ZipFile(model) as archive:
            return any(name.split("/", 1)[-1].startswith("data/aotinductor/model/")
                       for name in archive.namelist())  # fmt: skip
    except (OSError, zipfile.BadZipFile):
        return False


def _load_for_python(model: Path, op_libraries: Sequence[str] = ()) -> Callable[..., Any]:
    """MODEL loaded on CPU as Python runs it: the runtime's aoti_load for .pt2, else torch.jit.load
    (after the op libraries it needs)."""
    from pipeline.core.noise import library_warnings

    if is_pt2(model):
        try:
            return aoti_load(model)  # the runtime's loader: input checks on, as everywhere
        except Exception as e:  # the loader raises RuntimeError/zip errors of several kinds
            raise CppError(f"Cannot load the AOTInductor package {model}: {e}") from e
    try:
        oplibs.load_op_libraries(op_libraries)
    except oplibs.OpLibraryError as err:
        raise CppError(f"Cannot load {model} in Python: {err}") from None
    with library_warnings("torch.jit.load", FutureWarning):  # jit deprecation: see DESIGN.md
        return torch.jit.load(str(model), map_location="cpu").eval()


def python_latency(
    model: Path,
    inputs: list[torch.Tensor],
    *,
    threads: int,
    warmup: int,
    repeat: int,
    op_libraries: Sequence[str] = (),
) -> dict[str, Any]:
    """The C++ client's statistics for the same file (TorchScript or .pt2) run from Python."""
    import statistics
    import time

    module = _load_for_python(model, op_libraries)
    inputs = [t.contiguous() for t in inputs]  # as the client does (a .pt2 checks strides)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                module(*inputs)
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                module(*inputs)
                times.append((time.perf_counter() - start) * 1000)
    finally:
        torch.set_num_threads(previous)
    times.sort()

    def pct(q: float) -> float:  # nearest rank, as the C++ client computes it
        return times[min(len(times), max(1, -(-int(q * 100) * len(times) // 100))) - 1]

    return {"runs": repeat, "threads": threads, "format": "pt2" if is_pt2(model) else "torchscript",
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(times)}  # fmt: skip


def compare_latency(
    model: Path,
    inputs: list[torch.Tensor],
    *,
    binary: Path | None = None,
    threads: int = 1,
    warmup: int = 20,
    repeat: int = 200,
    rounds: int = 3,
    op_libraries: Sequence[str] = (),
) -> dict[str, Any]:
    """C++ vs Python on the same model file (TorchScript or .pt2) and inputs, in interleaved rounds.

    Rounds alternate the two so that a noisy neighbour slows both alike; the
    best round's p50 of each is compared (a ratio, not an absolute claim).
    """
    cpp_runs, py_runs = [], []
    same = {"threads": threads, "warmup": warmup, "repeat": repeat, "op_libraries": op_libraries}
    for _ in range(rounds):
        cpp_runs.append(run(model, [inputs], binary=binary, **same).stats)  # type: ignore[arg-type]
        py_runs.append(python_latency(model, inputs, **same))  # type: ignore[arg-type]
    best_cpp = min(cpp_runs, key=lambda s: s["p50_ms"])
    best_py = min(py_runs, key=lambda s: s["p50_ms"])
    return {
        "model": str(model),
        "batch": int(inputs[0].shape[0]) if inputs and inputs[0].ndim else 1,
        "threads": threads,
        "rounds": rounds,
        "cpp": best_cpp,
        "python": best_py,
        "cpp_over_python_p50": best_cpp["p50_ms"] / best_py["p50_ms"],
    }
