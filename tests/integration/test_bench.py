"""`pipeline bench` in quick mode: the shape of its output, never its speed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from pipeline.bench import BenchConfig, run_bench
from pipeline.core.checkpoint import sidecar_path
from pipeline.core.manifest import read_manifest
from pipeline.export import ExportResult
from tests.manifest_reads import counted


def test_quick_bench_writes_json_table_charts_and_the_fastest_backend(
    exported: ExportResult, tmp_path: Path
) -> None:
    # A copy (the session's export stays pristine whatever bench does), with its
    # checkpoint where the manifest's relative path points.
    export_dir = tmp_path / "copy" / "digits_lenet" / "export"
    shutil.copytree(exported.out_dir, export_dir)
    relative = read_manifest(export_dir).checkpoint.path
    source = exported.out_dir / relative
    target = (export_dir / relative).resolve()
    target.parent.mkdir(parents=True)
    shutil.copy2(source, target)
    shutil.copy2(sidecar_path(source), sidecar_path(target))
    manifest_before = (export_dir / "manifest.json").read_bytes()
    # An earlier run's entry for another model: bench merges, it does not overwrite.
    other = {"backend": "pt2", "format": "pt2", "median_ms": 1.0, "batch": 1}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "fastest.json").write_text(json.dumps({"my_cell": other}))
    with counted() as reads:
        result = run_bench(
            BenchConfig.quick(
                out_dir=tmp_path / "bench",
                export_dirs={"digits_lenet": export_dir},
                write_fastest=True,  # `bench --quick` writes none (test_bench_parts.py)
            )
        )
    # One bench, one read of the export's manifest: every layer (verify, both runtimes'
    # drivers, their private servers' start) is handed the opened export.
    assert reads == {export_dir.resolve(): 1}, reads
    data = json.loads(result.json_path.read_text())
    assert data == result.data | {"targets": data["targets"]}
    for key in ("machine", "matmul_peak_gflops", "cells", "served", "targets", "settings"):
        assert key in data, key
    assert data["machine"]["cores_physical"] >= 1
    assert data["machine"]["versions"]["torch"].startswith("2.14")
    assert data["matmul_peak_gflops"] > 0
    # Every phase timed, and together they are the whole run (to rounding); the
    # one-thread twins are measured only where the in-process runs use more.
    twins = {"digits_lenet in-process, one thread (the served workers' twins)"}
    assert set(data["phase_seconds"]) == {
        "setup (C++ client, matmul peak)",
        "digits_lenet in-process (verify + every batch size)",
        "digits_lenet served by TorchServe",
        "digits_lenet served by the KServe runtime",
        "digits_lenet served by the Ray Serve runtime",
        "digits_lenet peers",
    } | (twins if data["threads"] > 1 else set())
    assert sum(data["phase_seconds"].values()) <= data["duration_s"] + 0.5

    assert "pt2" in read_manifest(export_dir).artifacts  # `exported` writes every format
    backends = {c["backend"] for c in data["cells"]}
    assert {"eager", "torchscript", "onnxruntime", "pt2"} <= backends
    # Each backend names the registry format that serving it would archive.
    formats = {c["backend"]: c["format"] for c in data["cells"]}
    assert (
        formats.items()
        >= {
            "eager": "torchscript",
            "torchscript": "torchscript",
            "torchscript_frozen": "torchscript",
            "onnxruntime": "onnx",
            "pt2": "pt2",
        }.items()
    )
    for cell in data["cells"]:
        assert cell["runs"] >= 5 and cell["settings"]["rounds"] >= 1
        assert 0 < cell["median_ms"] <= cell["p90_ms"] <= cell["p99_ms"]
        if not cell["backend"].endswith("(1 thread)"):  # the workers' twins: latency only
            assert cell["gflops"] > 0 and cell["peak_fraction"] > 0  # a CNN: FLOPs counted
        assert "intra_op_threads" in cell["settings"]
        assert cell["verified"] is True
    onnx = next(c for c in data["cells"] if c["backend"] == "onnxruntime")
    assert onnx["settings"]["allow_spinning"] == "0"
    # The package's OpenMP loops follow torch.set_num_threads (compiled with dynamic threads).
    aoti = next(c for c in data["cells"] if c["backend"] == "pt2")
    assert aoti["settings"]["omp_kernel_threads"] == "torch.set_num_threads"
    assert aoti["threads"] == aoti["settings"]["intra_op_threads"]
    # LitServe is the `bench` extra: without it, one line says so and nothing else is skipped.
    litserve = importlib.util.find_spec("litserve") is not None
    assert [s["backend"] for s in data["skipped"]] == ([] if litserve else ["litserve/onnx"])

    served = data["served"]
    formats = ("torchscript", "onnx", "pt2")
    assert {(p["backend"], p["concurrency"]) for p in served} == {
        (f"torchserve/{f}", c) for f in formats for c in (1, 8)
    } | {(f"torchserve/{f}/direct", 1) for f in formats} | {  # the gateway's cost: without it
        (f"kserve/{f}", c)
        for f in formats
        for c in (1, 8)  # the second runtime, same levels
    } | {(f"ray/{f}", c) for f in formats for c in (1, 8)}  # the third, same inputs
    assert all(p["failed"] == 0 and p["throughput"] > 0 for p in served)
    # The runtimes' targets are computed from the same run: one per format each.
    named = [t["target"] for t in data["targets"]]
    for f in formats:
        assert sum(f"digits_lenet kserve/{f}: p50 at concurrency 1" in t for t in named) == 1
        # against each other runtime of the run: TorchServe and the Ray runtime
        assert sum(f"digits_lenet kserve/{f}: throughput at concurrency 8" in t for t in named) == 2

    # Peers: the yardstick, LitServe (batching off and on), the KServe runtime and the Ray
    # runtime on the same ONNX file and bodies, concurrency 1 and 8; the three
    # digits targets.
    peer_rows = {(p["backend"], p["batching"], p["concurrency"]) for p in data["peers"]}
    expected = {("yardstick/onnx", "off", c) for c in (1, 8)} | {
        (f"{ours}/onnx", "on", c) for ours in ("kserve", "ray") for c in (1, 8)
    }
    if litserve:
        expected |= {("litserve/onnx", b, c) for b in ("off", "on") for c in (1, 8)}
    assert peer_rows == expected
    assert all(p["failed"] == 0 and p["throughput"] > 0 for p in data["peers"])
    peer_named = [t["target"] for t in data["peer_targets"]]
    # one of each per runtime of ours: the KServe runtime's and the Ray runtime's
    assert sum("the yardstick's req/s" in t for t in peer_named) == 2
    assert sum("p50 at concurrency 1: ≤ 1.2× the yardstick's" in t for t in peer_named) == 2
    # Issue 40: our rows carry the server's own split, read from its /metrics around the
    # level: the KServe runtime's four stages, TorchServe's queue and backend; the peers'
    # servers have none.
    for row in [*data["served"], *data["peers"]]:
        split = row["server_ms"]
        if row["backend"].startswith("kserve/"):
            assert {"decode", "queue", "compute", "encode"} <= split.keys(), row
            assert 0 < split["server"] < row["mean_ms"], row
            # over the row's own requests: the window opens after the warm-up
            assert split["requests"] <= row["requests"], row
        elif row["backend"].startswith("torchserve/"):
            assert {"queue", "backend"} <= split.keys() and split["backend"] > 0, row
        else:
            assert split is None, row
    assert "client+HTTP" in result.markdown_path.read_text()
    assert sum("LitServe's req/s" in t for t in peer_named) == (2 if litserve else 0)
    table = result.markdown_path.read_text()
    assert "| digits_lenet | yardstick/onnx | off | 8 |" in table
    for t in data["peer_targets"]:
        line = f"{'PASS' if t['met'] else 'MISS'} {t['target']}: {t['value']:.2f}×"
        assert line in table
        assert t["met"] or f"where the time goes: {t['where']}" in table
    assert "| backend | batch |" in table and "torchserve/onnx" in table and "× eager" in table
    for chart in result.charts:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {c.name for c in result.charts} == {"latency.png", "throughput.png"}

    # The fastest verified backend goes to the bench's own fastest.json, with the
    # registry format it runs; the export is left exactly as export wrote it.
    assert (export_dir / "manifest.json").read_bytes() == manifest_before
    assert result.fastest_path == tmp_path / "bench" / "fastest.json"
    written = json.loads(result.fastest_path.read_text())
    assert written["my_cell"] == other
    fastest = written["digits_lenet"]
    assert fastest["backend"] in backends
    assert fastest["ranking"][0] == fastest["backend"]
    assert fastest["format"] in {"torchscript", "onnx", "pt2"}
    best = next(c for c in data["cells"] if c["backend"] == fastest["backend"] and c["batch"] == 1)
    assert fastest["format"] == best["format"]
    assert fastest["batch"] == 1 and fastest["median_ms"] == round(best["median_ms"], 4)
    assert data["fastest"]["digits_lenet"] == fastest
    assert "fastest.json" in table
