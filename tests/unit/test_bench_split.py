"""pipeline.bench.split: the server's own split of a served row, read from a real
prometheus_client exposition of the runtime's stage histograms."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pipeline.bench import split
from pipeline.runtimes.kserve.bench import read_split
from pipeline.runtimes.torchserve import bench as ts_bench


def _scrape(observed: dict[str, list[float]], model: str = "m") -> split.Totals:
    registry = CollectorRegistry()
    for stage in split.STAGES:
        h = Histogram(f"pipeline_kserve_{stage}_seconds", stage, ["model_name", "format"],
                      registry=registry)  # fmt: skip
        for seconds in observed.get(stage, []):
            h.labels(model_name=model, format="onnx").observe(seconds)
    return read_split(generate_latest(registry).decode())


def test_the_split_is_each_stages_mean_over_the_window_and_the_rest_is_the_clients() -> None:
    before = _scrape({s: [0.5] for s in split.STAGES})  # earlier requests: not this row's
    after = _scrape({s: [0.5, 0.001, 0.003] for s in split.STAGES})
    got = split.between(before, after, "m", mean_ms=10.0)
    assert got is not None
    assert got["decode"] == pytest.approx(2.0) and got["requests"] == 2
    assert got["server"] == pytest.approx(8.0)
    assert got["client_and_http"] == pytest.approx(2.0)
    assert "= 8.000 ms in the server; 2.000 ms client and HTTP" in split.describe(got)


TS_TEXT = """# TYPE ts_inference_latency_microseconds counter
ts_inference_latency_microseconds{{model_name="a_onnx",model_version="default",hostname="vm",}} {inference}
# TYPE ts_queue_latency_microseconds counter
ts_queue_latency_microseconds{{model_name="a_onnx",model_version="default",hostname="vm",}} {queue}
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{{model_name="a_onnx",model_version="default",hostname="vm",}} {n}
"""


def test_torchserves_counters_split_into_queue_and_the_workers_round_trip() -> None:
    """TorchServe's inference latency starts when the frontend takes the request, as the
    queue's does (its RestJob): the backend is the difference."""
    before = ts_bench.read_split(TS_TEXT.format(inference=1000.0, queue=100.0, n=1))
    after = ts_bench.read_split(TS_TEXT.format(inference=5000.0, queue=500.0, n=3))
    got = split.between(before, after, "a_onnx", mean_ms=3.0)
    assert got == {"queue": 0.2, "backend": 1.8, "requests": 2, "server": 2.0,
                   "client_and_http": 1.0}  # fmt: skip
    assert split.describe(got).startswith("queue 0.200 + backend 1.800 = 2.000 ms")


def test_no_split_without_requests_in_the_window_or_for_another_model() -> None:
    same = _scrape({s: [0.1] for s in split.STAGES})
    assert split.between(same, same, "m", 1.0) is None
    assert split.between({}, same, "other", 1.0) is None
    assert split.describe(None) == ""


def test_tracing_unset_is_judged_by_its_hooks_against_the_unset_rows() -> None:
    from pipeline.bench import footprint

    rows = [
        {"tracing": "unset", "concurrency": 1, "median_ms": 0.4, "throughput": 2500.0},
        {"tracing": "unset", "concurrency": 8, "median_ms": 1.6, "throughput": 5000.0},
        {"tracing": "on", "concurrency": 1, "median_ms": 0.5, "throughput": 2000.0},
    ]
    cheap, dear = (footprint.tracing_targets(rows, hooks_us=us) for us in (0.04, 10.0))
    assert [t["met"] for t in cheap] == [True, True]
    assert cheap[0]["value"] == pytest.approx(0.04 / 400) and "on 0.500 ms" in cheap[0]["detail"]
    assert cheap[1]["value"] == pytest.approx(0.04 / 200)  # 1e6 / 5000 µs a request
    assert [t["met"] for t in dear] == [False, False]  # 10 µs of 400 µs is 2.5%
    assert "MISS tracing unset" in footprint.markdown({"tracing_targets": dear})
    assert 0 < footprint.unset_hooks_us(n=1000) < 50


def test_the_shadow_checks_cost_is_judged_against_the_runs_own_spread() -> None:
    from pipeline.bench import footprint

    def rows(off: list[float], on: list[float], backend: str = "kserve/onnx") -> list[dict]:
        return [
            {"shadow": rate, "concurrency": 1, "median_ms": ms, "throughput": 1e3 / ms,
             "backend": backend}
            for rate, values in ((0.0, off), (0.01, on))
            for ms in values
        ]  # fmt: skip

    (near,) = footprint.shadow_targets(rows([0.40, 0.41, 0.40], [0.41, 0.41, 0.42]))
    assert near["met"] and near["value"] == pytest.approx(0.41 / 0.40 - 1)
    (far,) = footprint.shadow_targets(rows([0.40, 0.41, 0.40], [0.50, 0.52, 0.51]))
    assert not far["met"]  # 27% past, the spread without it 2.5%: the 5% bound holds
    (noisy,) = footprint.shadow_targets(rows([0.40, 0.60, 0.45], [0.50, 0.52, 0.51]))
    assert noisy["met"] and "bound 50.0%" in noisy["detail"]  # a noisy run widens the bound
    # Each runtime against its own rows without the check: TorchServe's cost is not hidden
    # by the KServe runtime's spread.
    both = rows([0.40, 0.60, 0.45], [0.50, 0.52, 0.51]) + rows(
        [0.40, 0.41, 0.40], [0.50, 0.52, 0.51], backend="torchserve/onnx"
    )
    kserve, torchserve = footprint.shadow_targets(both)
    assert kserve["met"] and kserve["target"].startswith("kserve/onnx: --shadow 0.01")
    assert not torchserve["met"] and torchserve["target"].startswith("torchserve/onnx:")
