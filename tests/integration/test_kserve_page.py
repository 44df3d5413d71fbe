"""docs/kserve.md's first example, run as written (issue 54: every runnable block runs):
serve, a curl request, `infer`, `verify --backend kserve`, `loadtest`, `stop`, and what
serving and stopping leave behind (loopback only, the token's mode, nothing running).

Two things differ from the page, both on purpose: free loopback ports replace 8085 and
8086, and the served export is the session's digits CNN (linked where the page's
`artifacts/digits_lenet/export` would be). `pipeline` commands run through `run_cli`
(forked from a process that imported torch: tests/cli_fork.py), the rest through bash.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import httpx
import psutil
import torch

from pipeline.export import ExportResult
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import INFERENCE_KEY_FILE, SERVER_FILE, Server
from tests.conftest import exited, run_cli
from tests.e2e.test_readme import KSERVE, blocks, commands, page_folder

PIPELINE = ".venv/bin/pipeline "


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if command.startswith(PIPELINE):
        return run_cli(*shlex.split(command.removeprefix(PIPELINE), comments=True), cwd=cwd)
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _stage(command: str) -> str:
    """`serve`, `infer`, ... for a pipeline command; the program's name for the rest."""
    words = shlex.split(command, comments=True)
    return words[1] if words[0] == PIPELINE.strip() else words[0]


def test_the_pages_example_serves_answers_and_stops_leaving_nothing(
    exported: ExportResult, tmp_path: Path
) -> None:
    (block,) = [b for b in blocks() if b.marker == KSERVE]
    page_folder(tmp_path, exported.out_dir)
    run_dir = tmp_path / "artifacts" / "serve"
    ports = {"8085": str(free_port()), "8086": str(free_port())}
    said: dict[str, str] = {}
    try:
        for command in commands(block):
            for page_port, port in ports.items():
                command = command.replace(page_port, port)
            proc = _run(command, tmp_path)
            assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
            said[_stage(command)] = proc.stdout
            if _stage(command) == "serve":
                record = _check_served(run_dir, proc.stdout)
    finally:
        stop(run_dir)
    assert set(said) >= {"serve", "curl", "infer", "verify", "loadtest", "stop"}, said
    for answer in (json.loads(said["curl"]), json.loads(said["infer"])):
        assert answer["model_name"] == "digits_lenet" and answer["outputs"], answer
    report = json.loads((tmp_path / "artifacts" / "digits_lenet" / "parity.json").read_text())
    served = {r["backend"]: r["passed"] for r in report["rows"] if r["backend"].startswith("k")}
    assert served == {"kserve/rest/onnx": True, "kserve/grpc/onnx": True}, report["rows"]
    assert "PASSED" in said["loadtest"], said["loadtest"]
    _check_stopped(run_dir, record, said["stop"])


def _check_served(run_dir: Path, printed: str) -> Server:
    """What `serve` left running: loopback only, a 0600 token, the workers it names."""
    assert "KServe is up" in printed
    record = Server.load(run_dir)
    assert record.runtime == "kserve" and record.inference_url.startswith("http://127.0.0.1:")
    assert (run_dir / INFERENCE_KEY_FILE).stat().st_mode & 0o777 == 0o600
    # The supervisor (record.pid) and its workers, which hold the ports.
    supervisor = psutil.Process(record.pid)
    listening = {
        c.laddr.ip.removeprefix("::ffff:")  # gRPC's dual-stack socket: still loopback
        for proc in (supervisor, *supervisor.children())
        for c in (getattr(proc, "net_connections", None) or proc.connections)(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }
    assert listening == {"127.0.0.1"}, listening
    # It says how many workers it started and why (bench's sweep or the cores rule).
    workers = re.search(r"workers: (\d+) × \d+ thread\(s\) \((.+)\)", printed)
    assert workers, printed
    assert len(supervisor.children()) == int(workers[1]) and workers[2]
    # And where they run the models: --device auto, what it comes to here.
    said = "the GPU" if torch.cuda.is_available() else "CPU (no CUDA here)"
    assert f"device:  auto: {said}" in printed, printed
    assert httpx.get(f"{record.inference_url}/v2/health/ready").status_code == 200
    return record


def _check_stopped(run_dir: Path, record: Server, printed: str) -> None:
    """`stop` left nothing running, and kept the token (test_kserve_operations.py)."""
    assert "stopped the KServe runtime" in printed
    assert exited(record.pid)
    marker = str(run_dir.resolve() / "kserve.json")
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert not (run_dir / SERVER_FILE).exists()
    assert (run_dir / INFERENCE_KEY_FILE).exists()
