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


def _running_under(folder: Path) -> list[int]:
    import psutil

    return [
        p.pid
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(str(folder) in part for part in (p.info.get("cmdline") or []))
        and p.pid != os.getpid()
    ]


def test_a_loadtest_terminated_stops_the_private_server_it_started(
    exported: ExportResult, tmp_path: Path
) -> None:
    """A SIGTERM to `loadtest --serve` (or `bench`) killed it alone: its private KServe
    supervisor and worker, re-parented to init, kept serving (a user's trial)."""
    argv = [sys.executable, "-m", "pipeline", "loadtest", "--serve", "--runtime", "kserve",
            "--model", "digits_lenet", "--export-dir", str(exported.out_dir), "--requests", "1000000",
            "--concurrency", "1", "--time-limit", "600"]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its private server's folder is in here
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(900):  # until the private server runs (bounded: 90 s)
            if _running_under(tmp_path) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert _running_under(tmp_path), "the private server never started"
        time.sleep(2)  # into the run
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        for _ in range(300):
            if not _running_under(tmp_path):
                break
            time.sleep(0.1)
        assert _running_under(tmp_path) == []
    finally:
        proc.kill()
        proc.wait()
        for pid in _running_under(tmp_path):
            os.kill(pid, signal.SIGKILL)
