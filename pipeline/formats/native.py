"""What the project's C++ programs share when run from Python: the LibTorch client
(pipeline/formats/cpp.py) and the ExecuTorch runner (pipeline/formats/pte_runner.py)
are each built with CMake and each hand back their outputs and timings."""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)


class CppError(PipelineError):
    """A C++ program could not be built or failed to run."""


@dataclass(frozen=True)
class CppRun:
    outputs: list[list[torch.Tensor]]  # per case, the flattened outputs
    stats: dict[str, Any]  # latency statistics printed by the program


def cmake_build(
    cmake: str, source: Path, build_dir: Path, args: list[str], jobs: int | None, what: str
) -> None:
    """Configure and build `source` in `build_dir`; CppError with the compiler's errors."""
    steps = [
        [cmake, "-S", str(source), "-B", str(build_dir), *args],
        [cmake, "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2)],
    ]
    for cmd in steps:
        log.info("%s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            text = (proc.stderr or "") + (proc.stdout or "")
            errors = [ln for ln in text.splitlines() if "rror" in ln][:15]
            raise CppError(
                f"Building {what} failed at `cmake {' '.join(cmd[1:3])}`:\n"
                + "\n".join(errors or text.splitlines()[-20:])
            )
