"""OpenTelemetry tracing for both runtimes, TorchServe's gateway and its handler (issue 40).

On only when the SDK's own variables ask for an OTLP exporter:
`OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), HTTP/protobuf,
with `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`/`_ARG`, `OTEL_BSP_*` and the rest read by
the SDK itself; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.
Off, nothing of the SDK is imported and every hook below is one `is None` test.

A request's trace continues the client's W3C `traceparent`/`tracestate` (REST headers,
gRPC metadata) or starts one; its answer carries `traceresponse` (W3C Trace Context
level 2: the same layout as traceparent, naming the server's span), and the access log
line names the trace id.

The stages are timed where the server already times them (the batcher's queue wait and
forward pass, decode, encode), so their spans are recorded afterwards with those
start and end times (`record`) instead of wrapping the code in context managers.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

TRACEPARENT, TRACESTATE, TRACERESPONSE = "traceparent", "tracestate", "traceresponse"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class Tracing:
    """The process's tracer and the W3C propagator (built by `setup`)."""

    def __init__(self, service: str) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.propagate import extract, inject
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, which win
        # over this default; the provider's sampler reads OTEL_TRACES_SAMPLER, and the
        # exporter and batch processor their own variables.
        resource = Resource.create({"service.name": service} | _service_from_env())
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("pipeline.serving")
        self._trace, self._extract, self._inject = trace, extract, inject
        self.server_kind, self.client_kind = trace.SpanKind.SERVER, trace.SpanKind.CLIENT

    @contextmanager
    def server_span(
        self, name: str, carrier: Mapping[str, str], attributes: Mapping[str, Any], **kw: Any
    ) -> Iterator[Any]:
        """A SERVER span, current inside the block, continuing the carrier's traceparent
        (`kw`: start_time and the like, as the SDK's start_as_current_span takes them)."""
        parent = self._extract(carrier) if TRACEPARENT in carrier else None
        with self.tracer.start_as_current_span(
            name, context=parent, kind=self.server_kind, attributes=dict(attributes), **kw
        ) as span:
            yield span

    @contextmanager
    def span(
        self, name: str, attributes: Mapping[str, Any] | None = None, **kw: Any
    ) -> Iterator[Any]:
        """A child span of the current one, current inside the block."""
        with self.tracer.start_as_current_span(name, attributes=dict(attributes or {}), **kw) as s:
            yield s

    def record(
        self,
        name: str,
        began: float,
        ended: float,
        attributes: Mapping[str, Any] | None = None,
        *,
        carrier: Mapping[str, str] | None = None,
        parent: Any = None,
        kind: Any = None,
    ) -> Any:
        """A finished span from two `time.perf_counter()` stamps, child of the current span
        (none outside a traced request: health checks and scrapes are not traced), of
        `parent`, or continuing `carrier`'s traceparent. Returns it (None: not recorded)."""
        if carrier is not None:
            context = self._extract(carrier)
        elif parent is not None:
            context = self._trace.set_span_in_context(parent)
        elif self._trace.get_current_span().is_recording():
            context = None
        else:
            return None
        now_ns, now = time.time_ns(), time.perf_counter()
        span = self.tracer.start_span(
            name,
            context=context,
            kind=kind or self._trace.SpanKind.INTERNAL,
            attributes=dict(attributes or {}),
            start_time=now_ns - int((now - began) * 1e9),
        )
        span.end(end_time=now_ns - int((now - ended) * 1e9))
        return span

    def inject(self, headers: dict[str, str]) -> None:
        """The current span's traceparent (and tracestate) into outgoing headers."""
        self._inject(headers)

    def current(self) -> Any:
        return self._trace.get_current_span()

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is still queued


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the SDK's variables ask for OTLP traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return any(environ.get(k, "").strip() for k in _ENDPOINTS)


TRACING: Tracing | None = None  # this process's, once `setup` found tracing asked for


def setup(service: str) -> Tracing | None:
    """Turn tracing on for this process when the environment asks for it (once)."""
    global TRACING
    if TRACING is None and wanted():
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol != "http/protobuf":
            log.warning("OTLP protocol %r asked for; traces go as http/protobuf", protocol)
        TRACING = Tracing(service)
        log.info("tracing on: OTLP/HTTP to %s", _endpoint())
    return TRACING


def trace_id(span: Any) -> str:
    """The span's trace id as 32 hex digits ("" for a span that is not recording)."""
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def traceresponse(span: Any) -> str:
    """W3C `traceresponse`: version, trace id, this span's id, flags."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def carrier_of(pairs: Any) -> dict[str, str]:
    """traceparent/tracestate from (name, value) pairs (ASGI bytes or gRPC metadata)."""
    out = {}
    for key, value in pairs or ():
        name = key.decode("latin-1").lower() if isinstance(key, bytes) else str(key).lower()
        if name in (TRACEPARENT, TRACESTATE):
            out[name] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return out


class TraceIdFilter(logging.Filter):
    """Adds the current span's trace id to access-log lines written inside a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        tracing = TRACING
        if tracing is not None:
            found = trace_id(tracing.current())
            if found and isinstance(record.msg, str) and "trace_id=" not in record.msg:
                record.msg = f"{record.msg} trace_id={found}"
        return True


def _service_from_env() -> dict[str, str]:
    name = os.environ.get("OTEL_SERVICE_NAME", "").strip()
    return {"service.name": name} if name else {}


def _endpoint() -> str:
    return next((os.environ[k] for k in _ENDPOINTS if os.environ.get(k, "").strip()), "")
