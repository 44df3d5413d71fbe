"""Starting and stopping the peer servers: processes of their own on 127.0.0.1.

Each peer is a script beside this module, run with this interpreter in a new
session (so one signal to its process group stops LitServe's worker and API
processes too), on a port from `free_port`. A peer is up when its readiness
route answers 200; it is recorded as a `Server` of the runtime whose protocol it
speaks, so the bench's one client reaches it with the same URL, headers and body
as that runtime.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from pipeline.serving.launcher import free_port
from pipeline.serving.server import INFERENCE_KEY_FILE, ServeError, Server

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
# LitServe spawns its worker and API processes and imports FastAPI in each: about 5 s
# here; the bound leaves room for a busy machine.
START_TIMEOUT_S = 90.0
# What `make bench` installs in the `bench` extra; the run says so when it is missing.
LITSERVE_PIN = "litserve==0.2.19"


def litserve_missing() -> str | None:
    """Why LitServe cannot be measured (one line), or None when it can."""
    if importlib.util.find_spec("litserve") is None:
        return (
            f"LitServe is skipped: it is not installed (`make bench` installs it, or "
            f"`.venv/bin/pip install '{LITSERVE_PIN}'`)"
        )
    return None


@dataclass(frozen=True)
class PeerSpec:
    """One peer to start: its label in the rows, its script and its settings."""

    label: str  # "yardstick", "litserve"
    script: str  # file beside this module
    batching: str  # "off" or "on", as the served rows say it
    ready_path: str  # GET answers 200 once the model is loaded
    args: tuple[str, ...] = ()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the peer's process group, SIGKILL what is left after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # LitServe's children may outlive their parent for a moment; the group is ours alone.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def started(spec: PeerSpec, onnx: Path, name: str, protocol_runtime: str) -> Iterator[Server]:
    """`spec`'s server serving `onnx` as `name` until the block ends (then stopped,
    whatever happened). `protocol_runtime`: the registered runtime whose routes and
    bodies the peer speaks, recorded as the Server's runtime."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=f"bench-{spec.label}-") as tmp:
        run_dir = Path(tmp)
        # The same Authorization header every server gets (peers ignore it): same request.
        token = os.urandom(16).hex()
        (run_dir / INFERENCE_KEY_FILE).write_text(json.dumps({"inference": {"key": token}}))
        log_path = run_dir / "server.log"
        # Resolved: the peer runs in its own folder (a relative --artifacts-dir left the
        # yardstick looking for art/digits_lenet/... there and the bench without it).
        onnx = Path(onnx).resolve()
        cmd = [sys.executable, str(HERE / spec.script), "--onnx", str(onnx), "--name", name]
        cmd += ["--port", str(port), *spec.args]
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp
            )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(proc, url + spec.ready_path, log_path, spec.label)
            yield Server(
                runtime=protocol_runtime,
                pid=proc.pid,
                run_dir=str(run_dir),
                inference_url=url,
                metrics_url="",
                models=[name],
            )
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path, label: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-600:]
            raise ServeError(f"{label} exited with {proc.returncode} before it was ready: {tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise ServeError(f"{label} was not ready at {url} within {START_TIMEOUT_S:.0f} s.")
