"""A real OTLP/HTTP trace receiver for tests: POST /v1/traces, protobuf bodies decoded
with opentelemetry-proto (the collector's own message types), on 127.0.0.1.

The servers under test export to it through the SDK's standard variables (`environ`).
"""

from __future__ import annotations

import gzip
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from pipeline.serving.launcher import inherited


@dataclass(frozen=True)
class Span:
    service: str
    trace_id: str  # 32 hex digits
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    kind: int
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource in request.resource_spans:
        attrs = {a.key: _value(a.value) for a in resource.resource.attributes}
        for scope in resource.scope_spans:
            for s in scope.spans:
                spans.append(
                    Span(
                        str(attrs.get("service.name", "")), s.trace_id.hex(), s.span_id.hex(),
                        s.parent_span_id.hex(), s.name, s.kind,
                        {a.key: _value(a.value) for a in s.attributes},
                        s.start_time_unix_nano, s.end_time_unix_nano,
                    )
                )  # fmt: skip
    return spans


@dataclass
class Receiver:
    """Collects every span exported to it; `spans_of(trace_id)` waits for them."""

    server: ThreadingHTTPServer
    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def environ(self, service: str | None = None) -> dict[str, str]:
        """The SDK's variables that send a server's traces here, exported within 0.1 s."""
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        return env | ({"OTEL_SERVICE_NAME": service} if service else {})

    def exporting(self, service: str | None = None) -> AbstractContextManager[None]:
        """This process's environment sends here while the block runs (a server started
        in it inherits the variables; the test process itself never traces)."""
        return inherited(self.environ(service))

    def spans_of(self, trace_id: str, names: set[str], timeout_s: float = 60.0) -> list[Span]:
        """The trace's spans, once every name in `names` has arrived (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                found = [s for s in self.spans if s.trace_id == trace_id]
            if names <= {s.name for s in found} or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start() -> Receiver:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            # Answered before the body is decoded: under a loaded CI machine the exporters
            # gave up waiting (BrokenPipe here), retried with backoff, and a worker's
            # spans arrived after the test had stopped waiting for them.
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            self.wfile.flush()
            spans = decode(body)
            with receiver.lock:
                receiver.spans.extend(spans)

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver
