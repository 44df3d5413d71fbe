"""`pipeline serve` waits for *its* gateway: another server on the gateway's port is not
taken for it (a CI run's serve returned 0 with the gateway dead and TorchServe's gRPC
server on the port, and every request got HTTP/2 back)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.export import ExportResult
from pipeline.runtimes.torchserve.launch import ServeConfig, _start_gateway
from pipeline.serving.launcher import free_port, orphans, stop
from pipeline.serving.server import ServeError, Server


def test_a_gateway_that_cannot_bind_is_an_error_even_if_the_port_answers(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "key_file.json").write_text("{}")
    with socket.socket() as other:  # "another server": it accepts connections on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        server = Server(
            runtime="torchserve", pid=os.getpid(), run_dir=str(tmp_path),
            inference_url=f"http://127.0.0.1:{port}", metrics_url="", models=[],
            extras={"backend_url": "http://127.0.0.1:9"},
        )  # fmt: skip
        config = ServeConfig(store=tmp_path, run_dir=tmp_path, inference_port=port)
        with pytest.raises(ServeError, match=r"The gateway exited with status 1"):
            _start_gateway(server, config, tmp_path)
    log = (tmp_path / "logs" / "gateway.log").read_text()
    assert "Address already in use" in log or "address already in use" in log, log


def test_a_serve_terminated_while_it_starts_leaves_nothing_running(
    exported: ExportResult, tmp_path: Path
) -> None:
    """CI's timeout sends SIGTERM: it killed `pipeline serve` alone, and the runtime it had
    started (here the KServe runtime's supervisor and workers) kept running."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "pipeline", "serve", "--runtime", "kserve",
            "--export-dir", str(exported.out_dir),
            "--port", str(free_port()), "--grpc-port", str(free_port()),
            "--run-dir", str(run_dir)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until the runtime's processes run (bounded: 60 s)
            if orphans(run_dir.resolve()) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert orphans(run_dir.resolve()), "the runtime never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        for _ in range(100):
            if not orphans(run_dir.resolve()):
                break
            time.sleep(0.1)
        assert orphans(run_dir.resolve()) == []
    finally:
        proc.kill()
        proc.wait()
        stop(run_dir)
