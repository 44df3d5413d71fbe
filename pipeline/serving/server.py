"""A running server as `pipeline serve` recorded it in `<run_dir>/server.json`, and `stop()`.

The record is what every client of the server starts from (infer, verify's
served backends, loadtest, bench, stop): its URLs, the processes to
recognise and signal, the token file, and which model and format each
served archive holds (from the archives' `archive.json`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.formats import base as registry
from pipeline.serving.archive import ArchiveInfo
from pipeline.serving.gateway import CONFIG_FILE as GATEWAY_CONFIG

SERVER_FILE = "server.json"
KEY_FILE = "key_file.json"
CONFIG_PROPERTIES = "config.properties"

log = logging.getLogger(__name__)


class ServeError(PipelineError):
    """TorchServe could not be started, reached or stopped."""


def default_run_dir() -> Path:
    return paths.artifacts_root() / "serve"


@dataclass(frozen=True)
class Server:
    """A running TorchServe, as recorded in server.json."""

    pid: int
    run_dir: str
    inference_url: str
    management_url: str
    metrics_url: str
    models: list[str]  # archive names (TorchServe's model names)
    started: float = 0.0  # the launcher's process creation time (psutil), to recognise it later
    backend_url: str = ""  # TorchServe's own inference API (loopback, behind the gateway)
    gateway_pid: int = 0
    gateway_started: float = 0.0
    # For HTTPS: the certificate clients trust (the server's own, for a self-signed one).
    ca_file: str | None = None
    failed: list[str] = field(default_factory=list)  # models that did not load (keep_going)
    # archive name → its archive.json (absent for archives without one)
    archives: dict[str, ArchiveInfo] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> Server:
        path = Path(run_dir) / SERVER_FILE
        if not path.is_file():
            raise ServeError(
                f"No server is running from {run_dir} ({path} is missing). Start one with `pipeline serve`."
            )
        data = json.loads(path.read_text())
        data["archives"] = {
            name: ArchiveInfo.from_json(info) for name, info in data.get("archives", {}).items()
        }
        return cls(**data)

    def record(self) -> None:
        """Write server.json into the run folder."""
        (Path(self.run_dir) / SERVER_FILE).write_text(json.dumps(asdict(self), indent=2))

    def keys(self) -> dict[str, str]:
        """The tokens TorchServe wrote: {'inference': ..., 'management': ...}."""
        path = Path(self.run_dir) / KEY_FILE
        try:
            data = json.loads(path.read_text())
            return {"inference": data["inference"]["key"], "management": data["management"]["key"]}
        except (OSError, ValueError, KeyError) as err:
            raise ServeError(f"Cannot read TorchServe's token file {path}: {err}") from None

    def archives_of(self, model: str) -> dict[str, ArchiveInfo]:
        """The served archives of `model` (as the export names it), by archive name, in
        registry order (TorchScript, the reference serialisation, first)."""
        order = registry.keys()
        mine = [
            (name, info)
            for name, info in self.archives.items()
            if info.model == model and name in self.models and name not in self.failed
        ]
        mine.sort(
            key=lambda item: order.index(item[1].format) if item[1].format in order else len(order)
        )
        return dict(mine)

    def alive(self) -> bool:
        """True only if the recorded pid is still *our* launcher (pids are reused)."""
        return is_process(self.pid, Path(self.run_dir) / CONFIG_PROPERTIES)

    def gateway_alive(self) -> bool:
        return is_process(self.gateway_pid, Path(self.run_dir) / GATEWAY_CONFIG)


def is_process(pid: int, marker: Path) -> bool:
    """Is `pid` a live process started with `marker` (its config file) on its command line?

    The command line, not the start time, identifies our processes: a reused
    pid runs something else, and start times read back from /proc can drift
    by more than a second under load.
    """
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and str(marker) in proc.cmdline()
    except psutil.Error:
        return False


def orphans(run_dir: Path) -> list[int]:
    """Pids of TorchServe launchers and gateways started from `run_dir` (found by command line)."""
    markers = {str(run_dir / CONFIG_PROPERTIES), str(run_dir / GATEWAY_CONFIG)}
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
