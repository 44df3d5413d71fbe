"""What the benchmark ran on, and the machine's measured fp32 matmul peak.

Achieved GFLOP/s only mean something next to what this CPU can do, so the
peak is measured in the same run (a large `torch.mm`), not taken from a spec
sheet: turbo, thermal limits and noisy neighbours affect both alike.
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import time
from typing import Any

import psutil
import torch

from pipeline.core.cpu import FLAGS_OF_INTEREST, cpu_model, cpuinfo  # noqa: F401 - callers import them here
from pipeline_runtime.runners import ort_session_options


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "n/a"


def machine_info() -> dict[str, Any]:
    model, flags = cpuinfo()
    return {
        "cpu": model,
        "cpu_flags": flags,
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "versions": {
            d: _version(d) for d in ("torch", "torchvision", "onnx", "onnxruntime", "torchserve")
        },
    }


def matmul_peak_gflops(threads: int, n: int = 2048, seconds: float = 2.0) -> float:
    """The machine's fp32 matmul peak: the better of torch's and ONNX Runtime's GEMM.

    Both are measured because neither library is fastest everywhere: on the
    AMD reference machine torch.mm (MKL) reached ~148 GFLOP/s while ONNX
    Runtime's own GEMM (MLAS) reached ~186, and its convolutions ~190.
    """
    # Two sizes for MLAS: its blocking favoured n=1024 here (~186 against ~170 GFLOP/s).
    return max(
        _torch_mm_gflops(threads, n, seconds / 3),
        _ort_matmul_gflops(threads, n, seconds / 3),
        _ort_matmul_gflops(threads, n // 2, seconds / 3),
    )


def _ort_matmul_gflops(threads: int, n: int, seconds: float) -> float:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "matmul",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    session = ort.InferenceSession(
        model.SerializeToString(),
        ort_session_options(threads),
        providers=["CPUExecutionProvider"],
    )
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((n, n), dtype=np.float32) for k in ("a", "b")}
    session.run(None, feeds)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        session.run(None, feeds)
        best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return best


def _torch_mm_gflops(threads: int, n: int, seconds: float) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen)
        b = torch.randn(n, n, generator=gen)
        out = torch.empty(n, n)
        torch.mm(a, b, out=out)  # warm-up: page in, pick the kernel
        best = 0.0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            dt = time.perf_counter() - t0
            best = max(best, 2 * n**3 / dt / 1e9)
        return best
    finally:
        torch.set_num_threads(previous)
