"""ONNX Runtime sessions, without torch: the one way every loader opens an ONNX file.

`runners.load_onnx` (verify, bench, the TorchServe handler) wraps a session in torch
tensors; the KServe runtime's lean workers (`pipeline.runtimes.kserve.loading`) call it
with numpy arrays and never import torch, so a worker serving only ONNX holds ONNX
Runtime's memory and not PyTorch's (about 500 MB).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ProviderError(RuntimeError):
    """A sound artifact this machine's runtime provider cannot run (export found so)."""


def session_options(threads: int | None = None) -> Any:
    """ONNX Runtime options for sharing a process with PyTorch.

    Spinning threads off: with ORT's default spin-waiting, eager PyTorch in the
    same process ran about 12× slower on the reference 2-core machine
    (../shared/DESIGN.md); in a TorchServe worker it steals the CPU too.
    `threads` None: one per CPU this process may run on.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads or len(os.sched_getaffinity(0)))
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def open_session(
    path: Path, cuda_index: int | None, threads: int | None, record: Mapping[str, Any]
) -> tuple[Any, bool]:
    """An InferenceSession for `path` and whether it runs on CUDA (`cuda_index` None: CPU;
    asked for CUDA where ONNX Runtime has no CUDA provider, CPU with a log line)."""
    import onnxruntime as ort

    providers: list[Any] = ["CPUExecutionProvider"]
    if cuda_index is not None:
        if "CUDAExecutionProvider" in ort.get_available_providers():
            _preload_cuda(ort)
            providers = [("CUDAExecutionProvider", {"device_id": cuda_index}), *providers]
        else:
            log.info("onnxruntime has no CUDAExecutionProvider here; running on CPU")
    if record.get("cpu_runs") is False and providers == ["CPUExecutionProvider"]:
        # Export tried, in a process of its own: loading it here could crash this one.
        raise ProviderError(
            f"{Path(path).name} does not run on ONNX Runtime's CPU provider "
            f"({record.get('cpu_problem') or 'export found so'}); run it on a GPU provider."
        )
    session = ort.InferenceSession(str(path), session_options(threads), providers=providers)
    return session, len(providers) > 1


def _preload_cuda(ort: Any) -> None:
    """Load the CUDA and cuDNN libraries of NVIDIA's wheels (onnxruntime-gpu's `cuda` and
    `cudnn` extras) before the first CUDA session: without torch in the process (the lean
    KServe worker) nothing else puts them where the CUDA provider finds them."""
    preload = getattr(ort, "preload_dlls", None)  # onnxruntime-gpu 1.21 and later
    if preload is None:
        return
    try:
        preload()
    except Exception as err:  # noqa: BLE001 - the provider may still find system libraries
        log.warning("onnxruntime.preload_dlls() failed (%s); relying on the system's CUDA", err)


def settings_of(session: Any) -> dict[str, Any]:
    """What a session was opened with, for reports."""
    options = session.get_session_options()
    return {
        "intra_op_threads": options.intra_op_num_threads,
        "inter_op_threads": options.inter_op_num_threads,
        "allow_spinning": "0",
        "providers": session.get_providers(),
    }
