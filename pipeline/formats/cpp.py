"""Build and run the LibTorch C++ client (cpp_client/) from Python.

The client runs TorchScript files and AOTInductor `.pt2` packages with the
same flags and output; `run()` and `compare_latency()` take either.

The client links the LibTorch inside the pinned torch wheel. That wheel is a
CUDA build, so its CMake config enables CUDA (a real nvcc) even for a CPU-only
client. `make venv` installs NVIDIA's own wheels of that CUDA version's
compiler (nvidia-cuda-nvcc, -crt, -cccl, nvvm) beside the runtime wheels torch
brings; `build()` lays them out as a toolkit in the build directory, so no
system CUDA toolkit is needed. `$CUDA_HOME` (or /usr/local/cuda when the wheels
are missing) is used otherwise; what is missing is named in the error.
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
from pathlib import Path
from typing import Any

import torch

from pipeline.formats.native import CppError, CppRun, cmake_build
from pipeline_runtime import oplibs
from pipeline_runtime.runners import aoti_load

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parents[2] / "cpp_client"
DEFAULT_BUILD_DIR = SOURCE_DIR / "build"
BINARY = "run_torchscript"
CUDA_ROOTS = ("/usr/local/cuda",)


def _wheel_cuda_dirs() -> list[Path]:
    """The nvidia/cuXX folders of the torch wheel's CUDA version (headers, libs, nvcc)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    if torch.version.cuda is None or spec is None or not spec.submodule_search_locations:
        return []
    major = torch.version.cuda.split(".")[0]
    return [
        Path(r, f"cu{major}")
        for r in spec.submodule_search_locations
        if Path(r, f"cu{major}").is_dir()
    ]


def _nvrtc() -> Path | None:
    """libnvrtc from the wheel's nvidia-* packages (a system toolkit's may be another version)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for candidate in sorted(Path(root).glob("cu*/lib/libnvrtc.so*")) + sorted(
            Path(root).glob("cuda_nvrtc/lib/libnvrtc.so*")
        ):
            if "builtins" not in candidate.name and "alt" not in candidate.name:
                return candidate
    return None


def wheel_nvcc_dir() -> Path | None:
    """The wheels' CUDA folder holding nvcc and nvvm (`make venv` installs them), or None: a
    GPU machine's own torch usually comes without them and has a system toolkit instead."""
    found = (d for d in _wheel_cuda_dirs() if (d / "bin" / "nvcc").is_file())
    return next((d for d in found if (d / "nvvm" / "bin").is_dir()), None)


def wheel_toolkit(dest: Path) -> Path | None:
    """A CUDA toolkit laid out at `dest` from the wheel's nvidia packages, or None.

    nvcc finds everything relative to its own folder ($TOP/lib64, $TOP/include,
    $TOP/nvvm), and the wheels keep the libraries in `lib` with only versioned
    names; CMake's FindCUDA wants `libcudart.so`. So `dest` gets real folders of
    symbolic links: bin/ and lib64/ per file (a linked folder would send nvcc's
    `..` back into site-packages), unversioned names beside the versioned ones.
    """
    source = wheel_nvcc_dir()
    if source is None:
        return None
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "bin").mkdir(parents=True)
    (dest / "lib64").mkdir()
    for item in (source / "bin").iterdir():
        (dest / "bin" / item.name).symlink_to(item)
    for name in ("include", "nvvm"):
        (dest / name).symlink_to(source / name)
    for item in (source / "lib").iterdir():
        (dest / "lib64" / item.name).symlink_to(item)
        if ".so." in item.name:
            plain = dest / "lib64" / (item.name.split(".so.")[0] + ".so")
            if not plain.exists():
                plain.symlink_to(item)
    return dest


def _system_roots() -> tuple[str, ...]:
    # PIPELINE_CUDA_ROOTS="" hides the system toolkit (tests build as on a machine without one).
    roots = os.environ.get("PIPELINE_CUDA_ROOTS")
    return CUDA_ROOTS if roots is None else tuple(r for r in roots.split(os.pathsep) if r)


def cmake_args(build_dir: Path | None = None) -> list[str]:
    """The -D flags the wheel's LibTorch needs on this machine."""
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", "-DCMAKE_BUILD_TYPE=Release"]
    if torch.version.cuda is None:  # a CPU-only wheel needs nothing more
        return args
    # Absolute: CMake reads relative paths against the build folder, not ours.
    build_dir = Path(build_dir or DEFAULT_BUILD_DIR).resolve()
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home and not Path(cuda_home, "bin", "nvcc").exists():
        # It outranks the wheels: a stale one failed deep in LibTorch's CMake config, in a
        # sentence cut off before the cause.
        raise CppError(
            f"CUDA_HOME={cuda_home} has no bin/nvcc, and it takes the place of the CUDA "
            "compiler `make venv` installs from NVIDIA's wheels: unset CUDA_HOME to use those, "
            "or point it at a CUDA toolkit."
        )
    toolkit = None if cuda_home else wheel_toolkit(build_dir / "cuda-toolkit")
    roots = _system_roots()
    cuda_root = cuda_home or (str(toolkit) if toolkit else None)
    cuda_root = cuda_root or next((r for r in roots if Path(r, "bin", "nvcc").exists()), None)
    if cuda_root is None:
        major = torch.version.cuda.split(".")[0]
        raise CppError(
            f"The installed torch {torch.__version__} is a CUDA {torch.version.cuda} build, and its "
            "LibTorch CMake config needs a CUDA compiler even for a CPU-only client, but none "
            f"was found: not the wheel's (nvidia/cu{major}/bin/nvcc), not $CUDA_HOME, not "
            f"{', '.join(roots) or 'a system toolkit'}. Run `make venv` (it installs NVIDIA's "
            f"nvidia-cuda-nvcc, -crt, -cccl and nvvm wheels for CUDA {torch.version.cuda}), or "
            f"install the CUDA {major} toolkit and set CUDA_HOME to it."
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
    args += [
        f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_root}",
        f"-DCUDA_nvrtc_LIBRARY={nvrtc}",
        f"-DCUDA_NVRTC_LIB={nvrtc}",
        f"-DTORCH_CUDA_ARCH_LIST={arch}",
    ]
    if toolkit is not None:
        # enable_language(CUDA) and FindCUDAToolkit search on their own (PATH,
        # /usr/local/cuda): hold both to the wheel's toolkit, whose version is torch's.
        hidden = [p for r in CUDA_ROOTS for p in (r, str(Path(r).resolve()))]
        args += [
            f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}",
            f"-DCUDAToolkit_ROOT={toolkit}",
            f"-DCMAKE_IGNORE_PREFIX_PATH={';'.join(hidden)}",
        ]
    return args


def configured_toolkit(build_dir: Path) -> str | None:
    """The CUDA toolkit a configured build directory used (from its CMake cache)."""
    cache = Path(build_dir) / "CMakeCache.txt"
    if not cache.is_file():
        return None
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("CUDA_TOOLKIT_ROOT_DIR:"):
            return line.split("=", 1)[1]
    return None


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
    args = cmake_args(build_dir)
    root = next(
        (a.split("=", 1)[1] for a in args if a.startswith("-DCUDA_TOOLKIT_ROOT_DIR=")), None
    )
    if configured_toolkit(build_dir) not in (None, root):
        # CMake keeps the first CUDA compiler it found; another toolkit needs a fresh cache.
        (build_dir / "CMakeCache.txt").unlink()
        shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
    cmake_build("cmake", SOURCE_DIR, build_dir, args, jobs, "the C++ client")
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
        if p.suffix in (".cpp", ".h", ".txt")
        # pte_runner/: the ExecuTorch runner, a program of its own (pipeline/formats/pte_runner.py)
        and not {"build", "pte_runner"} & set(p.relative_to(SOURCE_DIR).parts)
    ]
    if binary.is_file() and all(p.stat().st_mtime <= binary.stat().st_mtime for p in sources):
        return binary
    return build(build_dir)


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
        flags = {
            "--model": model,
            "--inputs": inputs,
            "--outputs": outputs,
            "--device": device,
            "--warmup": warmup,
            "--repeat": repeat,
        }
        cmd = [str(binary), *(str(part) for flag in flags.items() for part in flag)]
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
        with zipfile.ZipFile(model) as zf:
            return any(
                name.split("/", 1)[-1].startswith("data/aotinductor/model/")
                for name in zf.namelist()
            )
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

    return {
        "runs": repeat,
        "threads": threads,
        "format": "pt2" if is_pt2(model) else "torchscript",
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "mean_ms": statistics.fmean(times),
    }


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
