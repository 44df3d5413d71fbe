"""The TorchServe handler's side of the shadow check (pipeline_runtime.handlershadow), in
process: what it samples, what it drops, and the metric lines TorchServe's frontend reads
from the worker (TorchServe's own metrics cache writes them, as in a worker)."""

from __future__ import annotations

import math
import queue
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ts
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from pipeline_runtime import codec, handlershadow
from pipeline_runtime.handlershadow import ShadowCheck
from pipeline_runtime.shadowwire import Verdict

MODEL = "digits_lenet_onnx"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
LINE = re.compile(r"^\[METRICS\](pipeline_shadow_\w+)\.\w+:([^|]+)\|#([^|]*)\|#type:(\w+)\|")


class Context:
    """The part of ts.context.Context the check reads: request ids and headers."""

    def get_request_id(self, idx: int) -> str:
        return f"ts-{idx}"

    def get_request_header(self, idx: int, key: str) -> str | None:
        return f"00-{TRACE}-00f067aa0ba902b7-01" if key == "traceparent" and idx == 0 else None


def _check(samples: Any, verdicts: Any = None, rate: float = 1.0, draws: list[float] = ()) -> Any:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    drawn = iter(draws)
    return ShadowCheck(rate, MODEL, 1, "onnx", "/exports/digits", samples, verdicts, metrics,
                       draw=lambda: next(drawn, 0.0))  # fmt: skip


def _emitted(caplog: pytest.LogCaptureFixture) -> list[tuple[str, float, str, str]]:
    """(name, value, dimensions, type) of each metric line, in order."""
    found = (LINE.match(r.getMessage()) for r in caplog.records)
    return [(m[1], float(m[2]), m[3], m[4]) for m in found if m]


def _totals(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    totals: Counter[str] = Counter()
    for name, value, _, kind in _emitted(caplog):
        if kind == "COUNTER":
            totals[name.removeprefix("pipeline_shadow_").removesuffix("_total")] += value
    return totals


def _answered(n: int) -> list[Any]:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    return [(codec.Decoded({"image": x + i}, "json", unbatched=False), [x * i]) for i in range(n)]


@pytest.fixture(autouse=True)
def _info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")


def test_every_series_starts_at_zero_with_the_kserve_runtimes_labels(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _check(queue.Queue())
    lines = _emitted(caplog)
    assert [(n, v, t) for n, v, _, t in lines] == [
        (f"pipeline_shadow_{k}_total", 0.0, "COUNTER")
        for k in ("checked", "diverged", "dropped", "failed")
    ]
    assert {d for _, _, d, _ in lines} == {f"model_name:{MODEL},version:1,format:onnx"}


def test_answered_requests_are_sampled_at_the_rate_with_their_ids() -> None:
    samples: queue.Queue[Any] = queue.Queue()
    check = _check(samples, rate=0.5, draws=[0.1, 0.7, 0.2])
    results = _answered(3)
    results.insert(1, codec.RequestError("bad request"))  # answered with an error: not offered
    check.offer_results(results, Context())
    got = [samples.get_nowait() for _ in range(samples.qsize())]
    # Draws 0.1 and 0.2 are under the rate (requests 0 and 3); 0.7 (request 2) is not.
    assert [s.request_id for s in got] == ["ts-0", "ts-3"]
    assert [s.trace_id for s in got] == [TRACE, ""]
    first, (decoded, outputs) = got[0], results[0]
    assert first.inputs is decoded.arrays and first.outputs is outputs
    assert (first.model, first.version, first.format, first.export_dir) == (
        MODEL, 1, "onnx", "/exports/digits",
    )  # fmt: skip


def test_a_full_queue_drops_and_counts_never_waits(caplog: pytest.LogCaptureFixture) -> None:
    samples: queue.Queue[Any] = queue.Queue(maxsize=2)
    check = _check(samples)
    check.offer_results(_answered(5), Context())  # a blocking put would hang here
    assert samples.qsize() == 2
    assert _totals(caplog) == Counter({"dropped": 3})


def test_verdicts_become_counters_and_the_error_share(caplog: pytest.LogCaptureFixture) -> None:
    verdicts: queue.Queue[Any] = queue.Queue()
    check = _check(queue.Queue(), verdicts)
    for share, diverged, error in [(0.2, False, ""), (3.0, True, ""), (math.inf, True, ""),
                                   (0.0, False, "ArtifactError: no checkpoint")]:  # fmt: skip
        verdicts.put(Verdict(MODEL, 1, "onnx", diverged, share, error=error))
    assert check.drain(timeout_s=0) == 4 and check.drain(timeout_s=0) == 0
    assert _totals(caplog) == Counter({"checked": 3, "diverged": 2, "failed": 1})
    shares = [(v, d) for n, v, d, t in _emitted(caplog) if t == "HISTOGRAM"]
    # An infinite share is written as a finite number: TorchServe's Java parser takes no
    # "inf" (past its last bucket, 10, either way).
    assert shares == [(0.2, f"model_name:{MODEL},format:onnx"),
                      (3.0, f"model_name:{MODEL},format:onnx"),
                      (handlershadow.SHARE_CAP, f"model_name:{MODEL},format:onnx")]  # fmt: skip


def test_the_verdict_thread_ends_with_its_reference(caplog: pytest.LogCaptureFixture) -> None:
    verdicts: queue.Queue[Any] = queue.Queue()
    verdicts.put(Verdict(MODEL, 1, "onnx", False, 0.1))
    check = _check(queue.Queue(), verdicts)
    check.drain_while(alive=lambda: False)  # returns: the reference is gone
    assert _totals(caplog)["checked"] == 1
    assert "the reference process exited" in caplog.text


def test_off_without_the_servers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in handlershadow.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    handler = object()  # nothing of it is read when the check is off
    assert handlershadow.install(handler, Context()) is None


def test_both_runtimes_take_the_one_shadow_option() -> None:
    """Declared by TorchServe and by the KServe runtime alike: one option, each's own."""
    from pipeline.cli import build_parser
    from pipeline.cli.deploy import refuse_other_runtimes
    from pipeline.core.errors import PipelineError

    for name in ("torchserve", "kserve"):
        args = build_parser().parse_args(["serve", "--runtime", name, "--shadow", "0.5"])
        refuse_other_runtimes(args)  # not "for --runtime <the other>"
        assert args.shadow == 0.5 and "shadow" in {a.dest for a in args.runtime_options[name]}
    args = build_parser().parse_args(["serve", "--runtime", "kserve", "--live-versions"])
    with pytest.raises(PipelineError, match="--live-versions is for --runtime torchserve"):
        refuse_other_runtimes(args)
