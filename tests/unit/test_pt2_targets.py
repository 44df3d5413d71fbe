"""Issue 42's .pt2 targets from bench rows (in process, rows made here): met and missed,
and a miss says where the package's time goes."""

from __future__ import annotations

from typing import Any

from pipeline.bench.targets import pt2_targets, targets


def _cell(backend: str, batch: int, ms: float, p99: float | None = None) -> dict[str, Any]:
    return {"model": "m", "backend": backend, "batch": batch, "median_ms": ms,
            "p99_ms": p99 or ms * 1.2}  # fmt: skip


def test_met_missed_and_where_the_time_goes() -> None:
    cells = [
        _cell("pt2", 1, 0.080), _cell("onnxruntime", 1, 0.019),
        _cell("torchscript_frozen", 1, 0.100), _cell("cpp/pt2", 1, 0.075),
        _cell("pt2", 32, 0.40, p99=4.0), _cell("onnxruntime", 32, 0.42),
    ]  # fmt: skip
    found = {t["target"]: t for t in pt2_targets(cells)}
    frozen = found["m batch 1: Python .pt2 ≥ 0.95× TorchScript frozen's speed"]
    assert frozen["met"] and frozen["value"] == 0.100 / 0.080
    ort = found["m batch 1: Python .pt2 ≥ 0.9× ONNX Runtime's speed"]
    assert not ort["met"]
    assert "0.075 ms in the compiled code" in ort["detail"]
    assert "the compiled code is most of it" in ort["detail"]
    assert found["m batch 32: Python .pt2 ≥ 0.9× ONNX Runtime's speed"]["met"]
    tail = found["m batch 32: Python .pt2 p99 ≤ 5× p50"]
    assert not tail["met"] and "no C++ row at batch 32" in tail["detail"]
    assert found["m batch 1: Python .pt2 p99 ≤ 5× p50"]["met"]
    # No frozen TorchScript at batch 32 (this torch refused torch.jit, say): no such target.
    assert "m batch 32: Python .pt2 ≥ 0.95× TorchScript frozen's speed" not in found
    assert {t["target"] for t in pt2_targets(cells)} <= {t["target"] for t in targets(cells, [], 0)}


def test_a_slow_python_call_is_named() -> None:
    cells = [_cell("pt2", 1, 0.012), _cell("onnxruntime", 1, 0.006), _cell("cpp/pt2", 1, 0.003)]
    (ort,) = (t for t in pt2_targets(cells) if "ONNX Runtime" in t["target"])
    assert not ort["met"] and "the Python call is most of it" in ort["detail"]


def test_the_profile_names_the_operators_a_call_spends_its_time_in() -> None:
    import torch

    from pipeline.bench.inprocess import timed
    from pipeline.bench.pt2profile import top_ops

    a = torch.randn(64, 64)
    said = top_ops(timed(lambda: torch.mm(a, a).relu()), calls=20)
    assert said.startswith("torch.profiler's top operators, self CPU over 20 calls: ")
    assert "aten::mm " in said and "(1 a call)" in said
