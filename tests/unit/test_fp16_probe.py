"""The float16 ONNX graph is loaded in a child process at export: ONNX Runtime's CPU provider
crashes (SIGSEGV) on some (a float16 nn.LSTM), which must not take the export down; and an
artifact export found the CPU cannot run is refused by the loader, not loaded (a crash)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.formats import onnx_fp16
from pipeline_runtime.runners import ProviderError, load_onnx


def test_a_crash_while_loading_is_reported_not_suffered(monkeypatch: pytest.MonkeyPatch) -> None:
    crash = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
    monkeypatch.setattr(onnx_fp16, "_PROBE", crash)
    assert onnx_fp16.cpu_problem("any.onnx") == (
        "ONNX Runtime's CPU provider crashed loading it (SIGSEGV)"
    )


def test_a_refusal_is_reported_with_runtimes_words(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a graph")
    problem = onnx_fp16.cpu_problem(str(bad))
    assert problem and "crashed" not in problem


def test_the_loader_refuses_what_export_found_the_cpu_cannot_run(tmp_path: Path) -> None:
    record = {"cpu_runs": False, "cpu_problem": "crashed loading it (SIGSEGV)"}
    with pytest.raises(ProviderError, match=r"crashed loading it \(SIGSEGV\)"):
        load_onnx(tmp_path / "model.fp16.onnx", torch.device("cpu"), 1, record)
