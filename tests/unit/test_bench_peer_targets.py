"""Issue 28's peer targets from bench.json rows: ratios, PASS/MISS, where the time goes.

Rows written out by hand (the figures a run could give); the end-to-end run is
tests/integration/test_bench.py's quick bench.
"""

from __future__ import annotations

import subprocess
import sys

from pipeline.bench.peers.targets import lines, peer_targets


def _row(backend: str, batching: str, level: int, p50: float, rps: float) -> dict:
    return {
        "model": "digits_lenet", "backend": backend, "batching": batching,
        "concurrency": level, "median_ms": p50, "throughput": rps,
    }  # fmt: skip


CELLS = [
    {"model": "digits_lenet", "backend": "onnxruntime (1 thread)", "batch": 1, "median_ms": 0.1},
]
PEERS = [
    _row("yardstick/onnx", "off", 1, 0.8, 1200),
    _row("yardstick/onnx", "off", 8, 6.0, 1300),
    _row("litserve/onnx", "off", 8, 15.0, 400),
    _row("litserve/onnx", "on", 8, 17.0, 450),
    _row("kserve/onnx", "on", 1, 2.0, 500),  # 2.5× the yardstick's p50: a miss
    _row("kserve/onnx", "on", 8, 5.0, 1000),  # 0.77× its req/s: a miss; 2.2× LitServe's
]


def test_ratios_against_the_peers_and_litserve_at_its_better_setting() -> None:
    got = {t["target"]: t for t in peer_targets(CELLS, [], PEERS, ["kserve"])}
    assert len(got) == 3
    yard8, lit8, yard1 = got.values()
    assert round(yard8["value"], 3) == round(1000 / 1300, 3) and not yard8["met"]
    assert round(lit8["value"], 3) == round(1000 / 450, 3) and lit8["met"]  # batching on
    assert "batching on" in lit8["detail"]
    assert yard1["value"] == 2.5 and not yard1["met"]


def test_a_miss_says_where_the_time_goes_and_a_pass_does_not() -> None:
    out = lines(peer_targets(CELLS, [], PEERS, ["kserve"]))
    assert out[0].startswith("MISS digits_lenet kserve/onnx at concurrency 8: ≥ 1.0×")
    # 1000 / 1000 req/s = 1.00 ms a request, 0.1 of it the model in-process: 0.90 ms (90%).
    assert "ours 1.00 ms, 0.90 ms (90%) its own" in out[1]
    assert "in-process onnxruntime (1 thread) 0.100 ms" in out[1]
    assert out[2].startswith("PASS") and "where the time goes" not in out[3]
    assert "kserve 2.00 ms, 1.90 ms (95%) its own" in out[-1]


def test_resnet18_served_against_in_process_for_every_format() -> None:
    served = [
        {"model": "torchvision:resnet18", "backend": f"kserve/{f}", "batching": "on",
         "concurrency": 8, "throughput": t, "median_ms": 1.0}
        for f, t in (("onnx", 46.0), ("torchscript", 30.0))
    ]  # fmt: skip
    cells = [
        {"model": "torchvision:resnet18", "backend": b, "batch": 1, "throughput": 47.5,
         "median_ms": 21.0, "threads": 2}
        for b in ("onnxruntime", "torchscript")
    ]  # fmt: skip
    got = {t["target"].split()[1]: t for t in peer_targets(cells, served, [], ["kserve"])}
    assert set(got) == {"kserve/onnx", "kserve/torchscript"}
    assert got["kserve/onnx"]["met"] and not got["kserve/torchscript"]["met"]
    assert "served 33.33 ms" in got["kserve/torchscript"]["where"]


def test_without_litserve_the_reason_is_one_line() -> None:
    # A real interpreter in which litserve cannot be imported (None in sys.modules is
    # Python's own "not importable" marker).
    code = (
        "import sys\n"
        "sys.modules['litserve'] = None\n"
        "from pipeline.bench.peers.servers import litserve_missing\n"
        "print(litserve_missing())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("LitServe is skipped: it is not installed")
    assert "litserve==0.2.19" in out.stdout and out.stdout.count("\n") == 1
