"""Build and run the ExecuTorch C++ runner (cpp_client/pte_runner/) from Python.

The runner is what a device carries instead of LibTorch: ExecuTorch's runtime,
its optimised CPU kernels and the XNNPACK delegate, all from the executorch
wheel (libraries, headers, CMake package), and a .npy reader (the LibTorch
client reads `torch.save` files, which a runner without LibTorch cannot).
`run()` writes each case's inputs as .npy, runs the program once per case and
reads the .npy outputs back; `linked()` lists the shared libraries the binary
loads (`ldd`), so a test proves none of them is libtorch.

The wheel's imported CMake targets need CMake >= 3.28; the system's is used
when it is new enough, else the registry's `cmake` package (the `pte` extra).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.formats.native import CppError, CppRun, cmake_build
from pipeline_runtime import etprogram

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parents[2] / "cpp_client" / "pte_runner"
DEFAULT_BUILD_DIR = SOURCE_DIR / "build"
BINARY = "pte_runner"
CMAKE_MIN = (3, 28)


def package_dir() -> Path:
    """The installed executorch package (its lib/, include/ and share/cmake/)."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")  # a namespace package: no __file__
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / "share" / "cmake").is_dir():
            return Path(root).resolve()
    raise CppError(f"ExecuTorch is not installed; install {etprogram.INSTALL}.")


def _version(cmake: str) -> tuple[int, ...]:
    proc = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"version (\d+)\.(\d+)", proc.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def cmake_binary() -> str:
    """A cmake new enough for the wheel's targets: the system's, else the registry's."""
    system = shutil.which("cmake")
    if system and _version(system) >= CMAKE_MIN:
        return system
    try:
        import cmake

        bundled = Path(cmake.CMAKE_BIN_DIR) / "cmake"
    except ImportError:
        bundled = None
    if bundled is not None and bundled.is_file():
        return str(bundled)
    have = f"the system's is {'.'.join(map(str, _version(system)))}" if system else "none found"
    raise CppError(
        f"The ExecuTorch runner needs CMake {'.'.join(map(str, CMAKE_MIN))} or newer ({have}); "
        f"install {etprogram.INSTALL}, which brings the registry's cmake."
    )


def binary_path(build_dir: Path | None = None) -> Path:
    return Path(build_dir or DEFAULT_BUILD_DIR) / BINARY


def build(build_dir: Path | None = None, jobs: int | None = None) -> Path:
    """Configure and build the runner (incrementally); returns the executable."""
    build_dir = Path(build_dir or DEFAULT_BUILD_DIR)
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise CppError("No C++ compiler found; install g++ (Debian: apt-get install g++).")
    cmake = cmake_binary()
    config = package_dir() / "share" / "cmake"
    args = [f"-Dexecutorch_DIR={config}"]
    cmake_build(cmake, SOURCE_DIR, build_dir, args, jobs, "the ExecuTorch runner")
    binary = binary_path(build_dir)
    if not binary.is_file():
        raise CppError(f"The build finished but {binary} is missing.")
    return binary


def ensure_built(build_dir: Path | None = None) -> Path:
    """The executable, building it first when it is missing or older than its sources.
    One build at a time per folder: verify and bench in two processes wait for each other."""
    from filelock import FileLock  # torch's dependency: always there

    build_dir = Path(build_dir or DEFAULT_BUILD_DIR)
    build_dir.mkdir(parents=True, exist_ok=True)
    binary = binary_path(build_dir)
    sources = [p for p in SOURCE_DIR.iterdir() if p.suffix in (".cpp", ".h", ".txt")]
    with FileLock(str(build_dir / ".build.lock")):
        if binary.is_file() and all(p.stat().st_mtime <= binary.stat().st_mtime for p in sources):
            return binary
        return build(build_dir)


def linked(binary: Path) -> dict[str, str]:
    """The shared libraries `binary` loads (`ldd`): name → resolved path."""
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CppError(f"ldd {binary} failed: {proc.stderr.strip()[:300]}")
    found = {}
    for line in proc.stdout.splitlines():
        parts = line.split("=>")
        if len(parts) == 2:
            found[parts[0].strip()] = parts[1].split("(")[0].strip()
    return found


def footprint(binary: Path) -> dict[str, Any]:
    """What a device needs to run a program: the runner and the ExecuTorch libraries it
    loads, in bytes (the system's C and C++ libraries aside)."""
    libraries = linked(binary)  # one ldd for both questions
    sizes = {
        n: Path(p).stat().st_size
        for n, p in libraries.items()
        if "executorch" in n and Path(p).is_file()
    }
    return {
        "runner_bytes": binary.stat().st_size,
        "libraries": sizes,
        "total_bytes": binary.stat().st_size + sum(sizes.values()),
        "libtorch": sorted(n for n in libraries if "torch" in n and "executorch" not in n),
    }


def describe(binary: Path) -> str:
    """One line for reports: what the runner is and what a device carries to run it."""
    size = footprint(binary)
    return (
        f"ExecuTorch's runner {binary} ({size['runner_bytes'] / 1024:.0f} KiB; with the "
        f"ExecuTorch libraries it loads, {size['total_bytes'] / 2**20:.1f} MiB; libtorch "
        f"linked: {', '.join(size['libtorch']) or 'none'})"
    )


def _save(folder: Path, tensors: Sequence[torch.Tensor]) -> None:
    folder.mkdir(parents=True)
    for k, t in enumerate(tensors):
        t = t.detach().cpu()
        # numpy has no bfloat16: the runner takes such an input as float32 (exact: every
        # bfloat16 is a float32) and narrows it to the program's bfloat16.
        if t.dtype == torch.bfloat16:
            t = t.float()
        np.save(folder / f"{k}.npy", np.ascontiguousarray(t.numpy()))


def bfloat16_outputs(model: Path) -> list[bool]:
    """Which of the program's outputs are bfloat16, from its method meta: the runner writes
    them as float32 (numpy has no bfloat16) and `run()` narrows them back (exact)."""
    from executorch.exir.scalar_type import ScalarType

    with etprogram.quiet_stderr():
        meta = etprogram.runtime().load_program(Path(model)).metadata("forward")
    return [
        int(meta.output_tensor_meta(k).dtype()) == int(ScalarType.BFLOAT16)
        for k in range(meta.num_outputs())
    ]


def run(
    model: Path,
    cases: list[list[torch.Tensor]],
    *,
    binary: Path | None = None,
    warmup: int = 0,
    repeat: int = 1,
    timeout: float = 600,
    **_: Any,  # the LibTorch client's options (device, threads, op_libraries) mean nothing here
) -> CppRun:
    """Run the runner on `cases` (each a list of input tensors in forward order)."""
    binary = Path(binary or ensure_built())
    with tempfile.TemporaryDirectory(prefix="pipeline-pte-") as tmp:
        inputs, outputs = Path(tmp) / "inputs", Path(tmp) / "outputs"
        for i, case in enumerate(cases):
            _save(inputs / str(i), case)
        cmd = [
            str(binary),
            "--model",
            str(model),
            "--inputs",
            str(inputs),
            "--outputs",
            str(outputs),
        ]
        cmd += ["--warmup", str(warmup), "--repeat", str(repeat)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            how = (
                f"was killed by {signal.Signals(-proc.returncode).name}"
                if proc.returncode < 0
                else f"exited {proc.returncode}"
            )
            raise CppError(f"{BINARY} {how}: {runner_said(proc.stderr)}")
        results = []
        for i in range(len(cases)):
            folder = outputs / str(i)
            files = sorted(folder.glob("*.npy"), key=lambda p: int(p.stem))
            results.append([torch.from_numpy(np.load(f)) for f in files])
    if any(t.dtype == torch.float32 for r in results for t in r):  # a bfloat16 one, widened?
        narrow = bfloat16_outputs(model)
        results = [
            [t.to(torch.bfloat16) if b else t for t, b in zip(r, narrow, strict=True)]
            for r in results
        ]
    return CppRun(outputs=results, stats=json.loads(proc.stdout.strip().splitlines()[-1]))


# The runtime's log lines that say why a run failed, before the dump that follows them.
_WHY = re.compile(r"Check failed|[Mm]issing|OperatorMissing|failed|[Ee]rror")
_STAMP = re.compile(r"^[EWI] \d+:\d+:\d+\.\d+ ")  # "E 00:00:00.001649 " of each log line


def runner_said(stderr: str, limit: int = 600) -> str:
    """What the runner's stderr says of its failure, in one line: the runtime's lines that
    name a failed kernel check or a missing operator first, then its last line (the
    runner's own). The last 600 characters alone were the arguments ExecuTorch dumps after
    a failed kernel ("arg 1 with type id 4"), the kernel's "Check failed" cut off."""
    told = [
        _STAMP.sub("", ln.strip())
        for ln in stderr.splitlines()
        if ln.strip() and "cpuinfo" not in ln
    ]
    why = [ln for ln in told if _WHY.search(ln)]
    said = list(dict.fromkeys(why[:3] + told[-1:]))
    text = " | ".join(said)
    return text if len(text) <= limit else text[: limit - 1] + "…"
