"""The KServe runtime's supervisor: `python -m pipeline.runtimes.kserve.supervisor <run_dir>/kserve.json`.

`pipeline serve --runtime kserve` starts this process (its pid is the server's, its
process group the one `pipeline stop` signals). It starts `config.workers` runtime
processes (`python -m pipeline.runtimes.kserve.runtime <conf> --worker SLOT`), each with
its own models, batcher and Guard, all listening on the same HTTP and gRPC ports with
SO_REUSEPORT (the kernel spreads connections over them), and:

* readiness: each worker writes `workers/<slot>.ready` once its models are warmed up
  and its HTTP socket listens; when every slot has, this writes `workers/ready`, and
  only then does any worker answer /v2/health/ready with 200;
* metrics: the workers write theirs to `metrics/` (prometheus_client's multiprocess
  mode), so /metrics answers the sum over every worker whichever one a scrape reaches;
* a worker that dies is replaced (one log line: the slot, the pid, its exit status and
  the new pid), unless it died before the first full start (a model that does not load
  would fail again) or died MAX_DEATHS times within WINDOW_S (a crash loop): then every
  worker is stopped and this exits 1 with the reason;
* SIGTERM or SIGINT stops every worker gracefully (SIGKILL after the runtime's grace).

Nothing here imports kserve or torch: the supervisor stays small, and a worker's crash
cannot take it down.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from pipeline.runtimes.kserve.config import RuntimeConfig

log = logging.getLogger("pipeline.runtimes.kserve.supervisor")

WORKERS_DIR = "workers"  # in the run folder: <slot>.ready per worker, `ready` once all are
METRICS_DIR = "metrics"  # in the run folder: the workers' metric files, summed by a scrape
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it at import
ALL_READY = "ready"
MAX_DEATHS = 3  # deaths of one slot within WINDOW_S that count as a crash loop
WINDOW_S = 60.0
STOP_GRACE_S = 15.0  # the runtime's own grace (runtime.GRACE_S) plus its shutdown
POLL_S = 0.1
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def ready_marker(conf: Path, slot: int) -> Path:
    """The file worker `slot` writes once it serves."""
    return Path(conf).parent / WORKERS_DIR / f"{slot}.ready"


def all_ready_marker(conf: Path) -> Path:
    """The file this writes once every worker has served: readiness for all of them."""
    return Path(conf).parent / WORKERS_DIR / ALL_READY


def _die_with_parent() -> None:
    # A worker must not outlive a SIGKILLed supervisor: `pipeline stop` finds the server by
    # the supervisor's pid, and a worker left behind would hold the ports.
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _status(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


class Supervisor:
    def __init__(self, conf: Path, config: RuntimeConfig) -> None:
        self.conf = Path(conf).resolve()
        self.count = max(1, config.workers)
        self.procs: dict[int, subprocess.Popen] = {}
        self.deaths: dict[int, collections.deque[float]] = {
            s: collections.deque(maxlen=MAX_DEATHS) for s in range(self.count)
        }
        self.stopping = False
        self.all_ready = False

    def worker_argv(self, slot: int) -> list[str]:
        """The command of worker `slot`: a runtime process serving every model."""
        runtime = "pipeline.runtimes.kserve.runtime"
        return [sys.executable, "-m", runtime, str(self.conf), "--worker", str(slot)]

    def _spawn(self, slot: int) -> subprocess.Popen:
        ready_marker(self.conf, slot).unlink(missing_ok=True)
        # Same process group as this one (no new session): `pipeline stop` signals them all.
        # preexec_fn is safe here: the supervisor runs no other thread.
        proc = subprocess.Popen(self.worker_argv(slot), preexec_fn=_die_with_parent)
        self.procs[slot] = proc
        return proc

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def run(self) -> int:
        """Start the workers and keep them running until SIGTERM (0) or a crash loop (1)."""
        folder = self.conf.parent / WORKERS_DIR
        folder.mkdir(exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        # Every worker's metrics in one folder (prometheus_client's multiprocess mode, which
        # the workers inherit through the environment): a scrape that lands on any worker
        # returns the sum over all of them, dead ones' counts included.
        metrics = self.conf.parent / METRICS_DIR
        shutil.rmtree(metrics, ignore_errors=True)
        metrics.mkdir()
        os.environ[MULTIPROC_ENV] = str(metrics)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for slot in range(self.count):
            self._spawn(slot)
        log.info("started %d worker(s): pids %s", self.count, self.pids())
        code = 0
        while not self.stopping:
            if not self.all_ready and all(
                ready_marker(self.conf, s).exists() for s in range(self.count)
            ):
                all_ready_marker(self.conf).touch()
                self.all_ready = True
                log.info("all %d worker(s) ready", self.count)
            failure = self._replace_dead()
            if failure:
                log.error("%s; stopping every worker", failure)
                print(f"error: {failure}", file=sys.stderr, flush=True)
                code = 1
                break
            time.sleep(POLL_S)
        self._stop_workers()
        return code

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def _replace_dead(self) -> str | None:
        """Replace each dead worker; the reason to give up, if there is one."""
        for slot, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or self.stopping:
                continue
            if not self.all_ready:
                return f"worker {slot} (pid {proc.pid}) exited with {_status(code)} while starting"
            now = time.monotonic()
            deaths = self.deaths[slot]
            deaths.append(now)
            if len(deaths) == MAX_DEATHS and now - deaths[0] < WINDOW_S:
                return (
                    f"worker {slot} died {MAX_DEATHS} times within {WINDOW_S:.0f} s (last: "
                    f"pid {proc.pid}, {_status(code)}); not restarting it"
                )
            mark_process_dead(proc.pid)  # its live gauges go; its counts stay in the sum
            new = self._spawn(slot)
            log.warning(
                "worker %d (pid %d) exited with %s; started pid %d in its place",
                slot,
                proc.pid,
                _status(code),
                new.pid,
            )
        return None

    def _stop_workers(self) -> None:
        # They usually have SIGTERM already (`pipeline stop` signals the group); a second is
        # harmless (uvicorn only sets should_exit again), and needed when only we got it.
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "worker pid %d did not stop within %.0f s: SIGKILL", proc.pid, STOP_GRACE_S
                )
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print(
            "usage: python -m pipeline.runtimes.kserve.supervisor <run_dir>/kserve.json",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    conf = Path(argv[0])
    return Supervisor(conf, RuntimeConfig.read(conf)).run()


if __name__ == "__main__":
    sys.exit(main())
