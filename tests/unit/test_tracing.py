"""pipeline_runtime.tracing: when tracing is on, what it reads and what it records,
exported through the real SDK to a real OTLP/HTTP receiver (tests/otlp.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from pipeline_runtime import tracing
from tests import otlp


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_tracing_is_on_only_when_the_sdk_variables_ask(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_carrier_takes_only_the_trace_headers_whatever_their_case() -> None:
    pairs = [(b"Traceparent", b"00-a-b-01"), (b"authorization", b"secret"), ("tracestate", "k=v")]
    assert tracing.carrier_of(pairs) == {"traceparent": "00-a-b-01", "tracestate": "k=v"}
    assert tracing.carrier_of(None) == {}


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[tracing.Tracing, otlp.Receiver]]:
    receiver = otlp.start()
    for k, v in receiver.environ("unit").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(tracing, "TRACING", None)
    tracer = tracing.setup("default-name")
    assert tracer is not None
    try:
        yield tracer, receiver
    finally:
        tracer.shutdown()
        receiver.close()


def test_spans_continue_the_callers_trace_and_nest(
    traced: tuple[tracing.Tracing, otlp.Receiver],
) -> None:
    tracer, receiver = traced
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    carrier = {"traceparent": f"00-{trace_id}-{parent}-01"}
    began = time.perf_counter()
    with tracer.server_span("request", carrier, {"model.name": "m"}) as span:
        assert tracing.trace_id(span) == trace_id
        assert tracing.traceresponse(span).startswith(f"00-{trace_id}-")
        tracer.record("decode", began, time.perf_counter(), {"n": 1})
    tracer.provider.force_flush()
    spans = {s.name: s for s in receiver.spans_of(trace_id, {"request", "decode"})}
    assert spans["request"].parent_id == parent and spans["request"].service == "unit"
    assert spans["decode"].parent_id == spans["request"].span_id
    assert spans["decode"].start_ns <= spans["decode"].end_ns <= spans["request"].end_ns
    assert spans["request"].attributes == {"model.name": "m"}


def test_no_span_outside_a_request_and_the_access_log_names_the_trace(
    traced: tuple[tracing.Tracing, otlp.Receiver],
) -> None:
    tracer, _ = traced
    now = time.perf_counter()
    assert tracer.record("auth", now, now) is None  # a health check: not traced
    record = logging.LogRecord("access", logging.INFO, "", 0, "GET / 200", None, None)
    tracing.TraceIdFilter().filter(record)
    assert record.msg == "GET / 200"
    with tracer.server_span("request", {}, {}) as span:  # no traceparent: a new trace
        tracing.TraceIdFilter().filter(record)
    assert record.msg == f"GET / 200 trace_id={tracing.trace_id(span)}"
    assert len(tracing.trace_id(span)) == 32
