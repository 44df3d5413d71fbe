"""What starting and stopping any runtime's server shares: loopback addresses, free ports,
and `stop` (every runtime's processes are found by the marker files it declares)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import time
from pathlib import Path

import psutil

from pipeline.serving import runtime
from pipeline.serving.server import (
    INFERENCE_KEY_FILE,
    KEY_FILE,
    SERVER_FILE,
    ServeError,
    Server,
    default_run_dir,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger(__name__)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range, once per process. One the kernel picks
    (bind to 0) is ephemeral: an outgoing connection can take it before the server binds it
    (a fresh-clone CI run lost a TorchServe start so: "Address already in use")."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for port in random.sample(range(max(1024, low - 12000), low), 100):
        with socket.socket() as s:
            if port in _HANDED_OUT:
                continue
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise ServeError(f"No free port on {host} below {low}.")


def orphans(run_dir: Path) -> list[int]:
    """Pids of every runtime's processes started from `run_dir` (found by command line:
    each runtime declares its marker files)."""
    markers = {str(run_dir / marker) for marker in runtime.markers()}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        pid = proc.info["pid"]
        if markers.intersection(cmdline) and pid != os.getpid():
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:  # the group leaders we started, not java inside
                    found.append(pid)
    return found


def stop(run_dir: Path | None = None, timeout: float = 30.0) -> bool:
    """Stop the server started from `run_dir`; True if one was running."""
    run_dir = Path(run_dir or default_run_dir()).resolve()
    path = run_dir / SERVER_FILE
    was_running = False
    if path.is_file():
        server = Server.load(run_dir)
        if server.gateway_alive():
            _kill_group(server.gateway_pid, timeout)
        was_running = server.alive()
        if was_running:  # else a stale record: the pid may belong to someone else by now
            _kill_group(server.pid, timeout)  # the launcher, java and every worker share the group
    # Whatever is left from this run folder (a record lost, a killed test run): each is a
    # session leader, so its group holds java and the workers.
    for pid in orphans(run_dir):
        log.warning("stopping process %d left over from %s", pid, run_dir)
        _kill_group(pid, timeout)
        was_running = True
    path.unlink(missing_ok=True)
    (run_dir / KEY_FILE).unlink(missing_ok=True)
    (run_dir / INFERENCE_KEY_FILE).unlink(missing_ok=True)
    return was_running


def _kill_group(pgid: int, timeout: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.1)
        if not _group_alive(pgid):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    # Zombies of our own children still count as a group: reap what we can.
    try:
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
