"""docs/tracing.md's example, run as written against the tests' own OTLP receiver (issue 54:
every runnable block runs). Two things differ from the page, both on purpose: the
receiver's address replaces the collector's 127.0.0.1:4318 (Docker is not assumed), and a
free port replaces 8085. The served export is the session's digits CNN, where the page's
`artifacts/digits_lenet/export` would be."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pipeline.export import ExportResult
from pipeline.serving.launcher import free_port, stop
from tests import otlp
from tests.e2e.test_readme import TRACING, blocks, commands, page_folder

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"  # the page's traceparent
SPANS = {"POST /v2/models/{model}/infer", "auth", "decode", "queue", "forward", "encode"}


def test_the_tracing_example_sends_its_spans_and_names_the_trace(
    exported: ExportResult, tmp_path: Path
) -> None:
    (block,) = [b for b in blocks() if b.marker == TRACING]
    page_folder(tmp_path, exported.out_dir)
    receiver = otlp.start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PIPELINE_"))}
    printed = []
    try:
        for command in commands(block):
            command = command.replace("http://127.0.0.1:4318", receiver.endpoint).replace(
                "8085", str(port)
            )
            proc = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
            printed.append(proc.stdout)
        # The answer names the client's trace (W3C traceresponse), as the page says.
        assert any(f"traceresponse: 00-{TRACE_ID}-" in out.lower() for out in printed), printed
        spans = receiver.spans_of(TRACE_ID, SPANS)
        assert {s.name for s in spans} >= SPANS
        assert {s.service for s in spans} == {"digits"}  # OTEL_SERVICE_NAME, from the page
    finally:
        stop(tmp_path / "artifacts" / "serve")
        receiver.close()
