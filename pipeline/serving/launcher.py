"""What starting and stopping any runtime's server shares: loopback addresses, free ports,
and `stop` (every runtime's processes are found by the marker files it declares)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from pipeline.serving import runtime
from pipeline.serving.server import (
    SERVER_FILE,
    ServeError,
    Server,
    default_run_dir,
    run_dir_flag,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger(__name__)


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on (host, port) now. With SO_REUSEADDR, as the servers
    themselves bind (asyncio, the JVM): a port whose last connection is in TIME-WAIT (up to
    60 s after `pipeline stop` closed a kept-alive client) is free to them, and a port a
    server listens on is still refused."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()


# Where internal ports (and private servers' ports) come from when set, as "LOW-HIGH"
# (inclusive): a firewall's or a container's allowed range, or one of its own per test
# process so that two processes never hand out the same free-but-unbound port.
PORTS_ENV = "PIPELINE_PORTS"


def port_range() -> range:
    """Where free_port draws from: $PIPELINE_PORTS, else the 12,000 ports below the kernel's
    ephemeral range."""
    spec = os.environ.get(PORTS_ENV, "").strip()
    if spec:
        try:
            low, high = (int(part) for part in spec.split("-"))
        except ValueError:
            low, high = 0, -1
        if not 1024 <= low <= high <= 65535:
            raise ServeError(f"{PORTS_ENV}={spec!r}: expected LOW-HIGH within 1024-65535.")
        return range(low, high + 1)
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    return range(max(1024, low - 12000), low)


def free_port(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range (or in $PIPELINE_PORTS), once per
    process. One the kernel picks (bind to 0) is ephemeral: an outgoing connection can take
    it before the server binds it (a fresh-clone CI run lost a TorchServe start so:
    "Address already in use")."""
    ports = port_range()
    for port in random.sample(ports, min(100, len(ports))):
        with socket.socket() as s:
            if port in _HANDED_OUT:
                continue
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise ServeError(f"No free port on {host} in {ports.start}-{ports.stop - 1}.")


@dataclass
class Launch:
    """What every runtime's start checks before it starts a process (`prepare`)."""

    title: str  # for messages: "TorchServe", "the KServe runtime"
    run_dir: Path
    host: str  # where clients reach it
    # (host, port, option) each must be free: ("127.0.0.1", 8081, "--management-port")
    ports: list[tuple[str, int, str]] = field(default_factory=list)
    tls_cert: str | Path | None = None
    tls_key: str | Path | None = None
    # What stays on loopback whatever --host says, for the exposure warning.
    internal: str = ""


def exposure_warning(launch: Launch) -> str | None:
    """What to tell a user who serves on a non-loopback address (None on loopback)."""
    if launch.host in LOOPBACK:
        return None
    clear = (
        "" if launch.tls_cert else ", and tokens travel in clear text (use --tls-cert/--tls-key)"
    )
    return (
        f"The inference API will listen on {launch.host}, not loopback: anyone who can reach "
        f"this machine can try it{clear}. Keep the token file private.{launch.internal}"
    )


def check_tls(launch: Launch) -> None:
    """Both TLS files or neither, and each one there (ServeError otherwise): a runtime
    calls it before its own input checks, as the first thing `prepare` does."""
    if bool(launch.tls_cert) != bool(launch.tls_key):
        raise ServeError("HTTPS needs both --tls-cert and --tls-key.")
    for pem in (launch.tls_cert, launch.tls_key):
        if pem and not Path(pem).is_file():
            raise ServeError(f"TLS file {pem} does not exist.")


def prepare(launch: Launch) -> Path:
    """The checks every start makes, in order: the TLS pair, the loopback warning, a
    server already running from the run folder (a stale record is removed), the ports;
    then a fresh logs/ folder (the previous run's in logs.previous/, so its errors are not
    read as this run's). Returns the run folder, resolved. ServeError says what to change."""
    check_tls(launch)
    warning = exposure_warning(launch)
    if warning:
        log.warning("%s", warning)
    run_dir = Path(launch.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / SERVER_FILE).is_file():
        old = Server.load(run_dir)
        if old.alive():
            raise ServeError(
                f"A server is already running from {run_dir} (pid {old.pid}); stop it with "
                f"`pipeline stop{run_dir_flag(run_dir)}`."
            )
        (run_dir / SERVER_FILE).unlink()
    named: dict[int, str] = {}
    for _, port, opt in launch.ports:
        if not 1 <= port <= 65535:
            raise ServeError(f"{opt} {port} is not a port (1 to 65535).")
        if port in named:  # both bind with SO_REUSEPORT, and one of them never answers
            raise ServeError(f"{named[port]} and {opt} are both {port}: give each its own port.")
        named[port] = opt
    busy = [(host, port, opt) for host, port, opt in launch.ports if not port_free(host, port)]
    if busy:
        host, port, _ = busy[0]
        options = "/".join(opt for _, _, opt in launch.ports)
        raise ServeError(f"Port {port} on {host} is in use; pick others with {options}.")
    # The ports asked for are free but not yet bound: the internal ports this process
    # picks next (TorchServe's gRPC and backend ports) must not take one of them (a CI
    # run's TorchServe put its gRPC server on the gateway's --port, and requests to the
    # gateway were answered in HTTP/2).
    _HANDED_OUT.update(port for _, port, _ in launch.ports)
    logs = run_dir / "logs"
    if logs.exists():
        shutil.rmtree(run_dir / "logs.previous", ignore_errors=True)
        logs.rename(run_dir / "logs.previous")
    logs.mkdir()
    return run_dir


def spawn(
    argv: list[str],
    run_dir: Path,
    log_name: str,
    env: dict[str, str] | None = None,
    umask: int = -1,
) -> subprocess.Popen:
    """Start one of a runtime's processes in its own session (so `stop` signals its whole
    group), in `run_dir`, its output in logs/<log_name>."""
    with (run_dir / "logs" / log_name).open("ab") as out:
        return subprocess.Popen(
            argv,
            cwd=run_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            umask=umask,
        )


def created(pid: int) -> float:
    """A process's creation time (psutil), recorded to recognise it later."""
    return psutil.Process(pid).create_time()


def wait_until(
    ready: Callable[[], bool], proc: subprocess.Popen, output: Path, timeout_s: float, what: str
) -> None:
    """Poll `ready()` until it is true; ServeError with the tail of `output` when `proc`
    exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            tail = output.read_text(errors="replace")[-3000:]
            raise ServeError(f"{what} exited with status {proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            tail = output.read_text(errors="replace")[-3000:]
            raise ServeError(f"{what} was not ready within {timeout_s:.0f} s:\n{tail}")
        time.sleep(0.1)


@contextlib.contextmanager
def inherited(env: dict[str, str]) -> Iterator[None]:
    """`env` set in this process's environment while the block runs, then put back: a
    server started inside it inherits the variables (OTEL_* for bench's and the tests'
    traced servers) while this process itself never reads them."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def stopped_on_failure(run_dir: Path) -> Iterator[None]:
    """Whatever a start raises (Ctrl-C too), nothing it started is left running."""
    try:
        yield
    except BaseException:
        stop(run_dir)
        raise


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


def found_runtime(run_dir: Path | None = None) -> str | None:
    """The title of the runtime serving from `run_dir`: its record's, else the one whose
    marker files a left-over process was started with; None when neither is there."""
    run_dir = Path(run_dir or default_run_dir()).resolve()
    if (run_dir / SERVER_FILE).is_file():
        with contextlib.suppress(OSError, ValueError, TypeError, runtime.RuntimeNameError):
            return runtime.of(Server.load(run_dir)).title
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = set(proc.info.get("cmdline") or [])
        for rt in runtime.all_runtimes():
            if cmdline.intersection(str(run_dir / m) for m in rt.markers):
                return rt.title
    return None


def stop(run_dir: Path | None = None, timeout: float = 30.0) -> bool:
    """Stop the server started from `run_dir`; True if one was running. The files its
    runtime lists in `removed_on_stop` go with it (TorchServe's keys); without a record,
    no runtime is known and no key file is touched (a start replaces a stale one)."""
    run_dir = Path(run_dir or default_run_dir()).resolve()
    path = run_dir / SERVER_FILE
    was_running = False
    removed: tuple[str, ...] = ()
    if path.is_file():
        server = Server.load(run_dir)
        with contextlib.suppress(runtime.RuntimeNameError):  # a runtime not loaded here
            removed = runtime.of(server).removed_on_stop
        for pid in server.alive_pids():
            _kill_group(pid, timeout)
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
    for name in removed:
        (run_dir / name).unlink(missing_ok=True)
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
    """Whether a process of group `pgid` still runs. A zombie does not count: our own are
    reaped here, and another parent's (the daemonised server's launcher has exited, so
    its processes' parent is PID 1) wait for that parent to reap them, which in a
    container can take seconds, while nothing of the server runs any more."""
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
    running = _running_in_group(pgid)
    return True if running is None else running


def _running_in_group(pgid: int) -> bool | None:
    """Whether /proc shows a process of group `pgid` that is not a zombie (None where
    /proc cannot tell: not Linux)."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # pragma: no cover - not Linux
        return None
    for entry in filter(str.isdigit, entries):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone since the listing
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        state, _, group = stat.rpartition(")")[2].split()[:3]
        if int(group) == pgid and state not in "ZX":
            return True
    return False
