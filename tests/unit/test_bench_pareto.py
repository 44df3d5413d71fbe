"""bench's precision table (issue 29, point 3): speed-ups against the fastest float32
format, size ratios, and the fastest *within the budget* marked, never a format outside it.

The export stand-in carries what pareto.rows reads of an opened export: the registry's
formats, each artifact's manifest record (as export writes it) and its path.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pipeline.bench import pareto
from pipeline.formats import base as registry


class _Export:
    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self.records = records
        self.manifest = SimpleNamespace(artifact=lambda key: self.records.get(key, {}))

    def formats(self) -> list[registry.Format]:
        return [registry.get(k) for k in self.records]

    def path(self, key: str) -> Path:
        return Path("/nonexistent") / key


def _quality(value: float, within: bool) -> dict[str, Any]:
    return {"metric": "accuracy drop", "value": value, "unit": "points", "bound": 0.5,
            "within_budget": within, "agreement": 0.99, "sqnr_db": 39.9}  # fmt: skip


RECORDS = {
    "onnx": {"size_bytes": 4_000_000, "precision": "float32"},
    "torchscript": {"size_bytes": 4_100_000, "precision": "float32"},
    "onnx_int8_static": {"size_bytes": 1_000_000, "quality": _quality(1.2, False)},
    "onnx_int8_dynamic": {"size_bytes": 1_100_000, "quality": _quality(0.1, True)},
    "onnx_fp16": {"size_bytes": 2_000_000, "quality": _quality(0.0, True)},
}
# backend → (batch-1 ms, batch-32 ms); int8 static is fastest at both but breaks the budget.
MS = {"onnx": (1.0, 20.0), "torchscript": (2.0, 30.0), "onnx_int8_static": (0.3, 5.0),
      "onnx_int8_dynamic": (0.8, 25.0), "onnx_fp16": (1.5, 18.0)}  # fmt: skip


def _cells(verified: dict[str, bool] | None = None) -> list[dict[str, Any]]:
    out = []
    for key, (ms1, ms32) in MS.items():
        backend = registry.get(key).backend
        ok = (verified or {}).get(key, key != "onnx_int8_static")
        for batch, ms in ((1, ms1), (32, ms32)):
            out.append({"model": "m", "backend": backend, "batch": batch, "median_ms": ms,
                        "verified": ok})  # fmt: skip
    return out


def test_fastest_within_the_budget_never_one_outside_it() -> None:
    table = pareto.rows("m", _Export(RECORDS), _cells())  # type: ignore[arg-type]
    by = {r["format"]: r for r in table}
    assert by["onnx_int8_static"]["within_budget"] is False  # fastest, but 1.2 points lost
    assert by["onnx_int8_dynamic"]["fastest"] == [1]  # 0.8 ms: fastest of those within
    assert by["onnx_fp16"]["fastest"] == [32]  # 18 ms at batch 32
    assert sum(len(r["fastest"]) for r in table) == 2
    # Speed-up against the fastest float32 format at each batch (onnx: 1.0 and 20 ms).
    assert by["onnx_int8_dynamic"]["speedup_1"] == 1.0 / 0.8
    assert by["onnx_fp16"]["speedup_32"] == 20.0 / 18.0
    assert by["torchscript"]["speedup_1"] == 0.5
    assert by["onnx_int8_static"]["size_ratio"] == 1_000_000 / 4_100_000
    assert by["onnx"]["metric"] == "elementwise (atol/rtol)" and by["onnx"]["value"] is None


def test_a_format_verify_failed_is_outside_the_budget_whatever_export_recorded() -> None:
    # fp16's record says within, but this run's verify failed it: not a candidate.
    table = pareto.rows("m", _Export(RECORDS), _cells({"onnx_fp16": False}))  # type: ignore[arg-type]
    by = {r["format"]: r for r in table}
    assert by["onnx_fp16"]["within_budget"] is False
    assert by["onnx"]["fastest"] == [32]  # 20 ms: the fastest left within at batch 32


def test_markdown_marks_the_fastest_and_says_no_for_the_rest() -> None:
    table = pareto.rows("m", _Export(RECORDS), _cells())  # type: ignore[arg-type]
    md = pareto.markdown(table)
    assert "| m | onnx_int8_dynamic | int8 | 1.10 | 0.27 | 0.800 ★ | 1.25 |" in md
    line = next(x for x in md.splitlines() if "| onnx_int8_static |" in x)
    assert "★" not in line and line.endswith("| NO |")
    assert "accuracy drop: 1.20 points (bound 0.5); agreement 99.0%, SQNR 39.9 dB" in line
    # Only float32 formats: nothing to compare, no table.
    floats = {k: v for k, v in RECORDS.items() if k in ("onnx", "torchscript")}
    assert pareto.markdown(pareto.rows("m", _Export(floats), _cells())) == ""  # type: ignore[arg-type]


def test_chart_is_a_png(tmp_path: Path) -> None:
    table = pareto.rows("m", _Export(RECORDS), _cells())  # type: ignore[arg-type]
    path = pareto.chart(table, tmp_path / "precision.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
