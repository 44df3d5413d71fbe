"""TorchServe's workers: how many, whether they came up, and the first request.

Used by `start()` (torchserve.py); every call to TorchServe goes through the
client's management helpers.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import psutil

from pipeline.runtimes.torchserve import management
from pipeline.runtimes.torchserve.constants import KEY_FILE
from pipeline.serving import client
from pipeline.serving.server import ServeError, Server, default_run_dir

log = logging.getLogger(__name__)


def worker_plan(
    n_models: int, workers: int | None = None, threads: int | None = None
) -> tuple[int, int]:
    """Workers per model and threads per worker that fill the machine without oversubscribing.

    One thread per worker and as many workers as the physical cores allow:
    intra-op threads that outnumber the cores make the workers fight (two
    workers × two threads on 2 cores fell from ~40 to ~9 requests/s), while
    more single-threaded workers serve concurrent batches in parallel.
    """
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    workers = workers or max(1, cores // max(1, n_models))
    threads = threads or max(1, cores // max(1, n_models * workers))
    return workers, threads


def scale(server: Server, models: list[str], workers: int) -> None:
    for name in models:
        resp = management.management(
            server,
            "PUT",
            f"/models/{name}",
            params={"min_worker": workers, "max_worker": workers, "synchronous": "true"},
            timeout=300,
        )
        if resp.status_code != 200:
            log.warning("could not scale %s to %d workers: %s", name, workers, resp.text[:200])


def warm_up(server: Server, store: Path, models: list[str]) -> None:
    """One real prediction per model through the gateway, with the archive's golden inputs.

    Handlers warm their model up in `initialize`, but the first request still
    paid for everything around it: the gateway's connection to TorchServe, the
    Java frontend's first pass through its prediction path (JIT) and the
    worker's request decoding, about 50 ms against 5 ms steady for the digits
    CNN. Paying that here keeps it off the first user's request.
    """
    import torch

    for name in models:
        try:
            with zipfile.ZipFile(store / f"{name}.mar") as zf:
                golden = torch.load(
                    io.BytesIO(zf.read("golden.pt")), map_location="cpu", weights_only=True
                )
            body = client.numpy_body({k: v[:1] for k, v in golden["inputs"].items()})
            resp = client.post(
                server, name, body, "application/octet-stream", timeout=60, retries=2
            )
            if resp.status_code != 200:  # what the handler said: an answer too large, say
                said = " ".join(resp.text.split())[:400]
                log.warning("warm-up request to %s answered %d: %s", name, resp.status_code, said)
        except Exception as err:  # noqa: BLE001 - a warm-up failure must not stop the server
            log.warning("could not warm up %s: %s", name, err)


def wait_ready(
    server: Server, proc: subprocess.Popen, timeout: float, keep_going: bool = False
) -> set[str]:
    """Wait for every model's READY worker; return the ones that failed (keep_going only)."""
    deadline = time.monotonic() + timeout
    pending = set(server.models)
    failed: set[str] = set()
    while pending:
        if proc.poll() is not None:
            out = Path(server.run_dir) / "logs" / "torchserve.out"
            raise ServeError(
                f"TorchServe exited with status {proc.returncode} while starting. The end of its "
                f"output ({out}):\n{output_tail(out)}\nmodel errors:\n"
                f"{model_errors(Path(server.run_dir))}"
            )
        if time.monotonic() > deadline:
            raise ServeError(
                f"Model(s) {sorted(pending)} not READY after {timeout:.0f} s. The worker log says:\n"
                f"{model_errors(Path(server.run_dir))}"
            )
        time.sleep(0.5)
        if not (Path(server.run_dir) / KEY_FILE).is_file():
            continue
        for name in sorted(pending):
            try:
                workers = management.workers(server, name)
            except ServeError:
                break  # TorchServe is still writing its token file: read it on the next turn
            except httpx.HTTPError:
                break  # not listening yet
            if workers is not None:
                if any(w.get("status") == "READY" for w in workers):
                    pending.discard(name)
                    log.info("%s is READY", name)
                elif failed_to_load(server, name):
                    message = f"Model {name} failed to load. The worker log says:\n{model_errors(Path(server.run_dir))}"
                    if not keep_going:
                        raise ServeError(message)
                    log.error("%s\nServing the other models (keep_going).", message)
                    pending.discard(name)
                    failed.add(name)
    if failed == set(server.models):
        raise ServeError(
            f"No model loaded; the worker log says:\n{model_errors(Path(server.run_dir))}"
        )
    return failed


def failed_to_load(server: Server, name: str) -> bool:
    log_file = Path(server.run_dir) / "logs" / "model_log.log"
    if not log_file.is_file():
        return False
    text = log_file.read_text(errors="replace")
    # Only this model's worker lines count (W-<port>-<model>_<version>).
    mine = [ln for ln in text.splitlines() if f"-{name}_1.0" in ln]
    return any("Traceback" in ln or "Backend worker process died" in ln for ln in mine)


def output_tail(path: Path, limit: int = 10) -> str:
    """The last lines of TorchServe's own output (where it says "java not found")."""
    if not path.is_file():
        return f"(no {path.name} was written)"
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-limit:]) or f"({path.name} is empty)"


def model_errors(run_dir: Path, limit: int = 30) -> str:
    """The worker log's error lines (its last lines when none), for a failed start."""
    log_file = run_dir / "logs" / "model_log.log"
    if not log_file.is_file():
        return "(no model_log.log was written)"
    lines = log_file.read_text(errors="replace").splitlines()
    picked = [
        ln
        for ln in lines
        if any(w in ln for w in ("Error", "ERROR", "Traceback", "Refusing", "raise"))
    ]
    return "\n".join((picked or lines)[-limit:])


def status(run_dir: Path | None = None) -> dict[str, Any]:
    """Models and worker states of the running server."""
    server = Server.load(Path(run_dir or default_run_dir()))
    out: dict[str, Any] = {}
    for name in server.models:
        workers = management.workers(server, name)
        out[name] = None if workers is None else [w.get("status") for w in workers]
    return out


def _memory_mb(proc: psutil.Process) -> float:
    """Proportional set size where Linux reports it (shared pages split among the
    processes that share them, so a sum over processes is the memory they take),
    else resident size."""
    try:
        return getattr(proc.memory_full_info(), "pss", proc.memory_info().rss) / 2**20
    except psutil.AccessDenied:
        return proc.memory_info().rss / 2**20


def footprint(server: Server) -> tuple[int, float, float]:
    """(READY workers, their memory in MB, the whole server's in MB: TorchServe's
    launcher and Java frontend, every worker, the gateway). Processes that end while
    being read count as 0."""
    workers = []
    for name in server.models:
        if name in server.failed:
            continue
        workers += [
            w["pid"] for w in management.workers(server, name) or [] if w.get("status") == "READY"
        ]
    worker_mb = total_mb = 0.0
    roots = [p for p in (server.pid, *server.pids.values()) if p]
    seen: set[int] = set()
    for root in roots:
        try:
            procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                mb = _memory_mb(proc)
            except psutil.Error:
                continue
            total_mb += mb
            worker_mb += mb if proc.pid in workers else 0.0
    return len(workers), worker_mb, total_mb


def ready_pids(server: Server, archive: str) -> list[int]:
    """The pids of `archive`'s workers that TorchServe reports READY."""
    workers = management.workers(server, archive)
    if workers is None:
        raise ServeError(f"The server does not serve {archive}.")
    return sorted(w["pid"] for w in workers if w.get("status") == "READY")
