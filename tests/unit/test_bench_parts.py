"""The benchmark's parts on their own: machine facts, FLOPs, interleaving, summaries, report,
targets and fastest.json.

Fast and real (no mocks): tiny callables stand in for the exported backends,
whose end-to-end run is covered by tests/integration/test_bench.py.
"""

from __future__ import annotations

import hashlib
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from pipeline.bench.backends import format_runner, pt2_kernel_threads
from pipeline.bench.fastest import fastest_of, read_fastest, write_fastest
from pipeline.bench.inprocess import (
    MIN_RUNS,
    ROUND_WARMUP,
    Cell,
    Runner,
    cells,
    measure_interleaved,
    model_flops,
    timed,
)
from pipeline.bench.machine import machine_info, matmul_peak_gflops
from pipeline.bench.report import latency_chart, skipped_markdown, throughput_chart, to_markdown
from pipeline.bench.targets import targets
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline_runtime.manifest import (
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    TensorRecord,
    Tolerance,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_machine_info_has_the_keys_and_sane_values() -> None:
    info = machine_info()
    for key in ("cpu", "cpu_flags", "cores_physical", "cores_logical", "memory_gib", "os"):
        assert key in info, key
    assert isinstance(info["cpu"], str) and info["cpu"]
    assert isinstance(info["cpu_flags"], list)
    assert 1 <= info["cores_physical"] <= info["cores_logical"]
    assert info["memory_gib"] > 0
    assert info["python"].count(".") == 2
    assert info["torch_threads"] == torch.get_num_threads()
    versions = info["versions"]
    assert set(versions) == {"torch", "torchvision", "onnx", "onnxruntime", "torchserve"}
    assert torch.__version__.startswith(versions["torch"].split("+")[0])
    assert all(isinstance(v, str) and v for v in versions.values())  # 'n/a' when missing


def test_matmul_peak_is_positive_and_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    assert matmul_peak_gflops(1, n=256, seconds=0.2) > 0
    assert torch.get_num_threads() == before


def test_model_flops_of_a_linear_layer() -> None:
    # (2, 4) @ (4, 3): 2*4*3 multiply-adds, two FLOPs each; the bias is not counted.
    assert model_flops(torch.nn.Linear(4, 3), [torch.randn(2, 4)]) == 2 * 2 * 4 * 3


def test_timed_runs_repeat_calls_and_restores_threads() -> None:
    calls: list[int] = []
    before = torch.get_num_threads()
    stats = timed(lambda: calls.append(torch.get_num_threads()), threads=1)(3, 10)
    assert len(calls) == 13 and set(calls) == {1}  # warm-up + timed, all with the asked threads
    assert torch.get_num_threads() == before
    assert stats["runs"] == 10
    assert 0 <= stats["p50_ms"] <= stats["p90_ms"] <= stats["p99_ms"]


def test_timed_stops_warming_up_after_its_time_but_not_before_two_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.bench import inprocess

    calls: list[int] = []
    monkeypatch.setattr(inprocess, "WARMUP_S", 0.0)
    stats = timed(lambda: calls.append(1))(50, 4)
    assert len(calls) == inprocess.MIN_WARMUP + 4 and stats["runs"] == 4


def _recording_runner(name: str, log: list[tuple[str, int, int]]) -> Runner:
    def measure(warmup: int, repeat: int) -> dict[str, float]:
        log.append((name, warmup, repeat))
        return timed(lambda: sum(range(100)))(warmup, repeat)

    return Runner(name, measure, {"intra_op_threads": 1})


def test_measure_interleaved_rotates_the_order_and_counts_rounds() -> None:
    log: list[tuple[str, int, int]] = []
    runners = {n: _recording_runner(n, log) for n in ("a", "b", "c")}
    skipped = Runner("frozen", lambda w, r: pytest.fail("a skipped runner ran"), {"skipped": "x"})
    rounds = measure_interleaved(runners | {"frozen": skipped}, warmup=4, repeat=7, rounds=3)
    assert set(rounds) == {"a", "b", "c"}  # the skipped backend is left out
    assert all(len(per_round) == 3 for per_round in rounds.values())
    assert all(r["runs"] == 7 for per_round in rounds.values() for r in per_round)
    # One warm-up call each first, then each round in a rotated order, each backend's
    # turn starting with ROUND_WARMUP untimed calls (the first after another backend ran
    # is not its steady state).
    assert log[:3] == [("a", 4, 1), ("b", 4, 1), ("c", 4, 1)]
    assert [n for n, _, _ in log[3:]] == list("abc" + "bca" + "cab")
    assert all(w == ROUND_WARMUP and r == 7 for _, w, r in log[3:])


def test_measure_interleaved_stops_after_a_complete_round_when_the_budget_is_spent() -> None:
    slow = Runner("slow", timed(lambda: time.sleep(0.002)))
    fast = Runner("fast", timed(lambda: None))
    rounds = measure_interleaved(
        {"slow": slow, "fast": fast}, warmup=0, repeat=2, rounds=50, time_budget_s=0.0
    )
    assert {n: len(r) for n, r in rounds.items()} == {"slow": 1, "fast": 1}


def test_measure_interleaved_gives_slow_backends_fewer_calls_to_fit_the_budget() -> None:
    slow = Runner("slow", timed(lambda: time.sleep(0.005)))
    fast = Runner("fast", timed(lambda: None))
    rounds = measure_interleaved(
        {"slow": slow, "fast": fast}, warmup=1, repeat=30, rounds=2, time_budget_s=0.4
    )
    # 0.4 s / 2 rounds / 2 backends: 0.1 s a round each, twenty 5 ms calls at most (fewer
    # when the machine is loaded and a sleep of 5 ms takes longer: a full suite run saw a
    # 10 ms sleep measured at over 20 ms, and the share it left fell below 5 calls).
    assert {r["runs"] for r in rounds["fast"]} == {30}
    assert all(MIN_RUNS <= r["runs"] <= 20 for r in rounds["slow"])
    assert all(r["runs"] >= 5 for r in rounds["slow"])  # the budget's share, not the floor
    unbudgeted = measure_interleaved({"slow": slow}, warmup=0, repeat=12, rounds=1)
    assert unbudgeted["slow"][0]["runs"] == 12


def test_measure_interleaved_keeps_every_round_for_slow_backends_at_the_floor() -> None:
    # A share of 0.33 s / 3 rounds / 3 backends = 37 ms holds one 20 ms call (like
    # resnet18 at batch 32): MIN_RUNS each, and three rounds (0.36 s) still run
    # because the budget is checked only between rounds and two take 0.24 s.
    slow = {n: Runner(n, timed(lambda: time.sleep(0.02))) for n in ("a", "b", "c")}
    rounds = measure_interleaved(slow, warmup=0, repeat=30, rounds=3, time_budget_s=0.33)
    assert {n: [r["runs"] for r in rs] for n, rs in rounds.items()} == {
        n: [MIN_RUNS] * 3 for n in slow
    }


def test_a_failing_backend_becomes_a_skipped_one_and_the_others_go_on() -> None:
    calls = {"late": 0}

    def fails_at_once(warmup: int, repeat: int) -> dict[str, float]:
        raise RuntimeError("run_torchscript exited 1: cannot load model.pt2")

    def fails_later(warmup: int, repeat: int) -> dict[str, float]:
        calls["late"] += 1
        if calls["late"] > 2:  # the warm-up and the first round pass
            raise OSError("client vanished")
        return timed(lambda: None)(warmup, repeat)

    runners = {
        "eager": Runner("eager", timed(lambda: None), {"intra_op_threads": 1}),
        "cpp/pt2": Runner("cpp/pt2", fails_at_once, {"intra_op_threads": 1}),
        "late": Runner("late", fails_later, {}),
    }
    rounds = measure_interleaved(runners, warmup=1, repeat=3, rounds=3)
    assert set(rounds) == {"eager"} and len(rounds["eager"]) == 3
    assert runners["cpp/pt2"].settings["skipped"] == (
        "RuntimeError: run_torchscript exited 1: cannot load model.pt2"
    )
    assert runners["late"].settings["skipped"] == "OSError: client vanished"
    assert "skipped" not in runners["eager"].settings


def _fake_package(path: Path, sources: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as package:
        for name, text in sources.items():
            package.writestr(f"model/data/aotinductor/model/{name}", text)
    return path


def test_pt2_kernel_threads_reads_the_openmp_pragmas(tmp_path: Path) -> None:
    loop = "#pragma omp parallel\n{ int tid = omp_get_thread_num(); }"
    dynamic = _fake_package(tmp_path / "a.pt2", {"k.kernel.cpp": loop, "w.wrapper.cpp": ""})
    assert pt2_kernel_threads(dynamic) == "torch.set_num_threads"
    fixed = _fake_package(
        tmp_path / "b.pt2", {"k.kernel.cpp": loop.replace("parallel", "parallel num_threads(8)")}
    )
    assert pt2_kernel_threads(fixed) == "fixed at compile time: 8"
    serial = _fake_package(tmp_path / "c.pt2", {"k.kernel.cpp": "for (;;) {}"})
    assert pt2_kernel_threads(serial) == "none (serial loops)"
    assert pt2_kernel_threads(_fake_package(tmp_path / "d.pt2", {"k.so": ""})).startswith("unknown")


def _pt2_export(path: Path, device: str = "cpu") -> ExportedModel:
    """An opened export holding only the .pt2 at PATH (no eager model: none is needed)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    record = ArtifactRecord(path.name, "pt2", digest, details={"device": device})
    manifest = Manifest(
        model=ModelRecord("fake"),
        inputs=(TensorRecord("x", ("batch", 3), "float32"),),
        outputs=(TensorRecord("y", ("batch", 3), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("checkpoint.pt", "0" * 64),
        artifacts={"pt2": record},
    )
    return ExportedModel(path.parent, manifest, None, None, path.parent / "checkpoint.pt")  # type: ignore[arg-type]


def test_pt2_runner_skips_what_it_cannot_run_here_and_says_why(tmp_path: Path) -> None:
    args = [torch.zeros(1, 3)]
    broken = _fake_package(tmp_path / "model.pt2", {"k.kernel.cpp": ""})  # no compiled model
    pt2 = registry.get("pt2")
    runner, loaded = format_runner(_pt2_export(broken), pt2, args, threads=1)
    assert runner.name == "pt2" and runner.settings["skipped"] and loaded is None
    cuda, _ = format_runner(_pt2_export(broken, device="cuda"), pt2, args, threads=1)
    assert cuda.settings == {"skipped": "the package was compiled for cuda"}
    assert measure_interleaved({"pt2": runner, "cuda": cuda}, warmup=1, repeat=1, rounds=1) == {}


def test_cells_take_medians_over_rounds_and_derive_rates() -> None:
    def rnd(p50: float, p90: float, p99: float) -> dict[str, float]:
        return {"runs": 10, "p50_ms": p50, "p90_ms": p90, "p99_ms": p99}

    rounds = {
        "eager": [rnd(4.0, 5.0, 9.0), rnd(2.0, 3.0, 4.0), rnd(3.0, 4.0, 5.0)],
        "onnxruntime": [rnd(1.0, 1.5, 2.0), rnd(1.0, 2.0, 3.0)],
    }
    settings = {"onnxruntime": {"allow_spinning": "0"}}
    eager, ort = cells("m", 8, 2, rounds, flops=2 * 10**6, peak_gflops=4.0, settings=settings)
    assert (eager.backend, eager.batch, eager.threads, eager.runs) == ("eager", 8, 2, 30)
    assert (eager.median_ms, eager.p90_ms, eager.p99_ms) == (3.0, 4.0, 5.0)
    assert eager.throughput == pytest.approx(8 / 0.003)
    assert eager.gflops == pytest.approx(2e6 / 0.003 / 1e9)
    assert eager.peak_fraction == pytest.approx(eager.gflops / 4.0)
    assert eager.settings == {"rounds": 3}
    assert ort.median_ms == 1.0 and ort.p90_ms == 1.75 and ort.runs == 20
    assert ort.settings == {"allow_spinning": "0", "rounds": 2}

    (no_flops,) = cells("m", 1, 1, {"eager": rounds["eager"]}, None, 4.0, {})
    assert no_flops.gflops is None and no_flops.peak_fraction is None


def _cell(model: str, backend: str, batch: int, median: float, gflops: float | None = 1.0) -> Cell:
    return Cell(
        model=model,
        backend=backend,
        batch=batch,
        threads=2,
        runs=30,
        median_ms=median,
        p90_ms=median * 1.2,
        p99_ms=median * 1.5,
        throughput=batch / (median / 1e3),
        gflops=gflops,
        peak_fraction=None if gflops is None else gflops / 10.0,
    )


CELLS = [
    _cell("lenet", "onnxruntime", 32, 2.0),
    _cell("lenet", "eager", 32, 8.0),
    _cell("lenet", "eager", 1, 0.5),
    _cell("lenet", "torchscript", 1, 0.25),
    _cell("rnn", "eager", 1, 100.0, gflops=None),
    _cell("rnn", "onnxruntime", 1, 1.0, gflops=None),
]
MACHINE = {
    "cpu": "Test CPU",
    "cores_physical": 2,
    "cpu_flags": ["avx2", "fma"],
    "versions": {"torch": "2.x", "onnxruntime": "1.x"},
}


def test_to_markdown_has_one_sorted_table_per_model_with_ratios_to_eager() -> None:
    md = to_markdown(CELLS, MACHINE, peak_gflops=10.0)
    assert "Test CPU" in md and "avx2 fma" in md
    assert "10.0 GFLOP/s" in md
    assert md.count("| backend | batch |") == 2
    assert "#### lenet" in md and "#### rnn" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "backend" not in ln]
    lenet = [ln.split(" | ")[0].strip("| ") + "@" + ln.split(" | ")[1] for ln in rows[:4]]
    assert lenet == ["torchscript@1", "eager@1", "onnxruntime@32", "eager@32"]  # batch, median
    assert rows[0].endswith("| 10 | 2.00 |")  # torchscript: 10 % of peak, 2× eager at batch 1
    assert rows[2].endswith("| 4.00 |")  # onnxruntime vs eager at batch 32
    assert rows[5].startswith("| eager |") and "| — | — | 1.00 |" in rows[5]  # no FLOPs
    assert rows[4].endswith("| 100.00 |")


def test_skipped_table_keeps_one_row_per_line_whatever_the_reason_says() -> None:
    assert skipped_markdown([]) == ""
    md = skipped_markdown(
        [{"model": "m", "batch": 32, "backend": "cpp", "why": "no binary |\n  build it"}]
    )
    lines = md.splitlines()
    assert lines[:4] == [
        "#### Skipped",
        "",
        "| model | batch | backend | why |",
        "|---|---:|---|---|",
    ]
    assert lines[4:] == ["| m | 32 | cpp | no binary / build it |"]


def test_charts_write_png_files(tmp_path: Path) -> None:
    many = CELLS + [_cell(f"extra{i}", "eager", 1, 1.0) for i in range(3)]  # a 2-row grid
    latency = latency_chart(many, tmp_path / "latency.png")
    points = [
        {"model": m, "backend": b, "batching": on, "concurrency": c, "throughput": 10.0 * c}
        for m in ("lenet", "resnet")
        for b in ("torchserve/torchscript", "torchserve/onnx")
        for on in ("on", "off")
        for c in (1, 4, 16)
    ]
    throughput = throughput_chart(points, tmp_path / "served" / "throughput.png")
    for path in (latency, throughput):
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "latency.png",
        "throughput.png",
    ]  # written atomically: no temporary files left behind


def _row(backend: str, median: float, model: str = "lenet", batch: int = 1) -> dict:
    return asdict(_cell(model, backend, batch, median)) | {"verified": True}


def _served(backend: str, concurrency: int, batching: str, median: float, rps: float) -> dict:
    return {
        "model": "torchvision:resnet18",
        "backend": backend,
        "batching": batching,
        "concurrency": concurrency,
        "median_ms": median,
        "throughput": rps,
        "first_request_ms": None,
    }


def test_targets_compare_the_pt2_backends_like_the_torchscript_ones() -> None:
    cells = [_row(b, m) for b, m in (("torchscript", 1.0), ("cpp", 0.9), ("pt2", 0.5))]
    cells += [_row("cpp/pt2", 0.6)]
    cells += [
        _row(b, m, model="torchvision:resnet18")
        for b, m in (("pt2", 20.0), ("pt2 (1 thread)", 40.0), ("torchscript", 30.0))
    ]
    served = [
        _served("torchserve/pt2", 8, "on", 60.0, 45.0),
        _served("torchserve/pt2", 1, "off", 43.0, 23.0),
    ]
    by_name = {t["target"]: t for t in targets(cells, served, peak=100.0)}
    cpp_pt2 = by_name[
        "lenet: C++ client latency ≤ 1.05× Python, both on .pt2 (AOTInductor) (batch 1)"
    ]
    assert cpp_pt2["value"] == pytest.approx(1.2) and cpp_pt2["met"] is False
    ts = by_name["lenet: C++ client latency ≤ 1.05× Python, both on TorchScript (batch 1)"]
    assert ts["value"] == pytest.approx(0.9) and ts["met"] is True
    throughput = next(
        t for n, t in by_name.items() if n.startswith("TorchServe/pt2 at concurrency 8")
    )
    assert throughput["value"] == pytest.approx(45.0 / 50.0)  # vs 1 / 20 ms in-process
    added = next(t for n, t in by_name.items() if "TorchServe/pt2 added p50" in n)
    assert added["value"] == pytest.approx(3.0)  # against the single-threaded twin


def test_targets_report_batching_wait_gateway_cost_and_throughput_against_old_defaults() -> None:
    served = [
        _served("torchserve/onnx", 1, "on", 3.2, 300.0),
        _served("torchserve/onnx", 1, "off", 2.1, 400.0),
        _served("torchserve/onnx/direct", 1, "off", 1.7, 500.0),
        _served("torchserve/onnx", 8, "on", 880.0 / 100, 880.0),
        _served("torchserve/onnx", 8, "old", 860.0 / 100, 860.0),
    ]
    by_name = {t["target"]: t for t in targets([], served, peak=100.0)}
    model = "torchvision:resnet18 onnx"
    ratio = by_name[
        f"{model}: served p50 at concurrency 1 (archive defaults, through the gateway) ≤ 1.1× TorchServe's own port with batching off"
    ]
    assert ratio["value"] == pytest.approx(3.2 / 1.7) and ratio["met"] is False
    wait = next(t for n, t in by_name.items() if n.startswith(f"{model}: a lone request waits"))
    assert wait["value"] == pytest.approx(1.1) and wait["met"] is False
    cost = next(t for n, t in by_name.items() if n.startswith(f"{model}: gateway cost"))
    assert cost["value"] == pytest.approx(0.4) and cost["met"] is True
    thr = next(t for n, t in by_name.items() if "with the archive defaults ≥ the old" in n)
    assert thr["value"] == pytest.approx(880 / 860) and thr["met"] is True
    # Without the direct or the old-defaults figures there is nothing to compare: no row.
    partial = targets([], served[:2], peak=100.0)
    assert [t["target"].split(": ")[1][:22] for t in partial] == ["a lone request waits ≤"]


def test_targets_compare_each_onnx_opset_conversion_with_the_exported_model() -> None:
    cells = [_row("onnxruntime", 1.0), _row("onnxruntime (opset 20)", 1.25)]
    cells += [_row("onnxruntime", 2.0, batch=32)]  # no conversion at batch 32: no target
    opsets = [t for t in targets(cells, [], peak=100.0) if "opset" in t["target"]]
    assert [t["target"] for t in opsets] == [
        "lenet batch 1: the exported ONNX opset is at least as fast as opset 20"
    ]
    assert opsets[0]["value"] == pytest.approx(0.8) and opsets[0]["met"] is True


def _ranked(
    backend: str, median: float, fmt: str, *, verified: bool = True, batch: int = 1
) -> dict:
    return _row(backend, median, batch=batch) | {"format": fmt, "verified": verified}


def test_fastest_is_the_quickest_verified_backend_at_batch_1_with_its_format() -> None:
    rows = [
        _ranked("eager", 0.5, "torchscript"),
        _ranked("cpp/pt2", 0.1, "pt2", verified=False),  # failed parity: never chosen
        _ranked("onnxruntime", 0.3, "onnx"),
        _ranked("onnxruntime (1 thread)", 0.2, "onnx"),  # a served worker's twin
        _ranked("pt2", 0.05, "pt2", batch=32),  # ranked at batch 1 only
        _ranked("torchscript_frozen", 0.4, "torchscript"),
        _ranked("onnxruntime (opset 20)", 0.25, "onnx"),
    ]
    best = fastest_of(rows, exclude_suffix=" (1 thread)")
    assert best is not None
    choice = ("backend", "format", "median_ms", "batch", "ranking")
    assert {k: best[k] for k in choice} == {
        "backend": "onnxruntime",
        "format": "onnx",
        "median_ms": 0.3,
        "batch": 1,
        # The servers' own runners only: eager, frozen TorchScript and an opset-20 copy
        # are no artifact a server runs (fastest.json named "onnxruntime (opset 20)").
        "ranking": ["onnxruntime"],
    }
    assert best["measured"].endswith("+00:00")  # ISO 8601, UTC
    # What serve needs to say why, and to choose again within a stricter accuracy budget.
    assert [c["backend"] for c in best["candidates"]] == best["ranking"]
    assert [e["backend"] for e in best["excluded"]] == ["cpp/pt2"]
    assert best["why"].startswith("onnxruntime (onnx, float32) is the fastest at batch 1")
    assert fastest_of([_ranked("eager", 0.5, "torchscript", verified=False)]) is None


def test_fastest_json_keeps_other_models_and_drops_a_model_with_nothing_verified(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bench" / "fastest.json"
    assert read_fastest(path) == {}
    old = {"backend": "pt2", "format": "pt2", "median_ms": 1.0}
    write_fastest(path, {"my_cell": old, "wrap_rnn": old, "torchvision:resnet18": old})
    new = {"backend": "onnxruntime", "format": "onnx", "median_ms": 0.5}
    write_fastest(path, {"torchvision:resnet18": new, "wrap_rnn": None})
    assert read_fastest(path) == {"my_cell": old, "torchvision:resnet18": new}
    path.write_text("not json")  # a broken file is bench's own: written anew, not fatal
    write_fastest(path, {"my_cell": old})
    assert read_fastest(path) == {"my_cell": old}


def test_a_quick_bench_names_no_fastest_backend() -> None:
    """Five calls decide nothing: `bench --quick` wrote fastest.json, which `archive` and
    `serve` follow (a user's two quick runs served int8, then float16)."""
    from pipeline.bench.config import BenchConfig

    assert BenchConfig.quick().write_fastest is False
    assert BenchConfig().write_fastest is True


def test_every_export_is_looked_for_before_anything_is_measured(tmp_path: Path) -> None:
    # `bench` measured digits for 25 s, then failed on the default model list's
    # torchvision:resnet18, which had no export (a user's trial).
    from pipeline.bench import run_bench
    from pipeline.bench.config import BenchConfig
    from pipeline.core.errors import PipelineError

    config = BenchConfig(models=("digits_lenet", "my_cell"), artifacts_root=tmp_path, cpp=False)
    with pytest.raises(PipelineError, match="No export of digits_lenet, my_cell in "):
        run_bench(config)  # both named at once, before the setup phase measures anything


def test_the_footprint_and_shadow_phases_measure_only_the_runtimes_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `bench --runtime kserve` still started TorchServe and Ray for cold start, memory and
    # the shadow check's cost: 354 s of a 449 s run (a user's trial).
    from pipeline.bench import footprint

    started: list[str] = []

    class Runtime:
        def __init__(self, name: str) -> None:
            self.name, self.shadow = name, True

        def private(self, *args: object, **kwargs: object) -> object:
            started.append(self.name)
            raise footprint.PipelineError("not started in a unit test")

    fakes = [Runtime("torchserve"), Runtime("kserve"), Runtime("ray")]
    monkeypatch.setattr(footprint.runtime, "all_runtimes", lambda: fakes)

    class Exported:
        def formats(self) -> list:
            return [type("F", (), {"key": "onnx", "served": True})()]

    rows, skipped = footprint.footprints("m", Exported(), ("kserve",))  # type: ignore[arg-type]
    assert started == ["kserve"] and rows == [] and len(skipped) == 1
    assert [rt.name for rt in footprint.chosen(None)] == ["torchserve", "kserve", "ray"]
