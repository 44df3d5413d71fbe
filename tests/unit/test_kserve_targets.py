"""The KServe runtime's bench targets compare it with every other runtime of the run,
found through the registry (runtimes/kserve imports no other runtime)."""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline.runtimes.kserve.bench import targets


def _point(backend: str, concurrency: int, median_ms: float, throughput: float) -> dict:
    return {"model": "digits_lenet", "backend": backend, "concurrency": concurrency,
            "batching": "on", "median_ms": median_ms, "throughput": throughput}  # fmt: skip


SERVED = [
    _point("kserve/onnx", 1, 1.5, 600.0),
    _point("kserve/onnx", 8, 3.0, 2700.0),
    _point("torchserve/onnx", 1, 6.0, 150.0),
    _point("torchserve/onnx", 8, 15.0, 540.0),
    _point(
        "torchserve/onnx/direct", 1, 5.0, 180.0
    ),  # another route into TorchServe: no row of its own
]


def test_kserve_is_held_against_every_other_runtime_of_the_run() -> None:
    rows = {t["target"]: t for t in targets([], SERVED)}
    p50 = rows["digits_lenet kserve/onnx: p50 at concurrency 1 ≤ 2 ms"]
    assert p50["met"] and p50["detail"] == "1.50 ms; TorchServe 6.00 ms"
    thr = rows[
        "digits_lenet kserve/onnx: throughput at concurrency 8 ≥ 3× TorchServe's (each with its defaults)"
    ]
    assert thr["met"] and thr["value"] == 5.0 and thr["detail"] == "2700 vs 540 requests/s"
    assert len(rows) == 2  # the direct route is no row of its own


def test_without_another_runtime_only_its_own_target_is_left() -> None:
    rows = targets([], [p for p in SERVED if p["backend"].startswith("kserve/")])
    assert [t["target"] for t in rows] == ["digits_lenet kserve/onnx: p50 at concurrency 1 ≤ 2 ms"]


def test_the_kserve_package_imports_no_other_runtime() -> None:
    package = Path(__file__).resolve().parents[2] / "pipeline" / "runtimes" / "kserve"
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            module = getattr(node, "module", None) if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [module or ""]
            found += [
                f"{path.name}: {n}" for n in names if n.startswith("pipeline.runtimes.torchserve")
            ]
    assert found == [], found  # deploy asks the registry for KServe's `pytorch` runtime
