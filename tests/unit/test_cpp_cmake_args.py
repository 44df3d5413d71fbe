"""The C++ client's CMake flags (pipeline/formats/cpp.cmake_args): a CUDA_HOME that holds
no CUDA compiler outranked the wheel's, and the build failed in LibTorch's CMake config
with a sentence cut off before its cause."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.formats import cpp


@pytest.mark.skipif(torch.version.cuda is None, reason="a CPU-only torch needs no CUDA compiler")
def test_a_cuda_home_without_nvcc_is_named_before_cmake_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nonexistent"))
    with pytest.raises(cpp.CppError, match=r"CUDA_HOME=.*nonexistent has no bin/nvcc") as err:
        cpp.cmake_args(tmp_path / "build")
    assert "unset CUDA_HOME" in str(err.value)
