"""The KServe runtime's supervisor, driven with real worker processes that are cheap.

The workers here are tiny Python processes (no kserve, no model) that behave as a
runtime worker does towards its supervisor: write the ready marker, then serve (sleep)
or die. What is under test is the supervisor's own logic, on real processes and real
exit statuses: it waits for every worker before it declares readiness, replaces a
worker that dies after the first full start, gives up with exit status 1 and the
reason when a slot dies MAX_DEATHS times within WINDOW_S (a crash loop) or when a
worker dies while starting, and stops every worker on SIGTERM. The real runtime's
replacement under load is tests/integration/test_kserve_workers.py.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.runtimes.kserve import supervisor as sup
from pipeline.runtimes.kserve.config import RuntimeConfig
from tests.conftest import exited

# argv[1]: the ready marker to write; argv[2]: seconds to live after it (then exit 3),
# or "start-fail" to exit 4 before writing the marker.
WORKER = """
import sys, time
from pathlib import Path
if sys.argv[2] == "start-fail":
    sys.exit(4)
Path(sys.argv[1]).touch()
time.sleep(float(sys.argv[2]))
sys.exit(3)
"""


class ScriptedSupervisor(sup.Supervisor):
    """The real supervisor; only the worker command differs (`lives[slot]`: one entry per
    start of that slot, the last repeated)."""

    def __init__(self, conf: Path, config: RuntimeConfig, lives: dict[int, list[str]]) -> None:
        super().__init__(conf, config)
        self.lives = lives
        self.starts: dict[int, int] = dict.fromkeys(lives, 0)

    def worker_argv(self, slot: int) -> list[str]:
        plan = self.lives[slot]
        life = plan[min(self.starts[slot], len(plan) - 1)]
        self.starts[slot] += 1
        return [sys.executable, "-c", WORKER, str(sup.ready_marker(self.conf, slot)), life]


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    return tmp_path / "kserve.json"


def _config(workers: int) -> RuntimeConfig:
    return RuntimeConfig(models=[], workers=workers)


@pytest.fixture(autouse=True)
def _no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    # run() goes in a thread here, where handlers cannot be installed; tests stop it
    # through the handler itself (`_stop`).
    monkeypatch.setattr(sup.signal, "signal", lambda *args: None)


def _run(supervisor: sup.Supervisor, timeout: float = 30.0) -> int:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()), daemon=True)
    thread.start()
    thread.join(timeout)
    if not result:
        supervisor._stop(signal.SIGTERM, None)
        thread.join(sup.STOP_GRACE_S + 5)
    assert result, f"the supervisor did not return within {timeout} s"
    return result[0]


def test_crash_loop_stops_everything_and_exits_1(
    conf: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Slot 0 serves on; slot 1 dies 0.3 s after each start: MAX_DEATHS deaths within
    # WINDOW_S is a crash loop, so the supervisor stops slot 0 too and exits 1.
    supervisor = ScriptedSupervisor(conf, _config(2), {0: ["600"], 1: ["0.3"]})
    conf.parent.mkdir(exist_ok=True)
    assert _run(supervisor) == 1
    assert supervisor.starts[1] == sup.MAX_DEATHS  # replaced MAX_DEATHS - 1 times, then not
    assert supervisor.starts[0] == 1
    err = capsys.readouterr().err
    assert f"worker 1 died {sup.MAX_DEATHS} times within {sup.WINDOW_S:.0f} s" in err
    assert "exit status 3" in err and "not restarting it" in err
    assert all(exited(p) for p in supervisor.pids())
    replaced = [r for r in caplog.records if "started pid" in r.getMessage()]
    assert len(replaced) == sup.MAX_DEATHS - 1


def test_deaths_spread_beyond_the_window_are_replaced(
    conf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same deaths spread wider than the window are no crash loop: each is replaced,
    # and SIGTERM (here: stopping) ends the run with 0.
    monkeypatch.setattr(sup, "WINDOW_S", 0.2)
    supervisor = ScriptedSupervisor(conf, _config(1), {0: ["0.3"]})
    conf.parent.mkdir(exist_ok=True)
    stopper = threading.Timer(3.0, supervisor._stop, args=(signal.SIGTERM, None))
    stopper.start()
    assert _run(supervisor) == 0
    assert supervisor.starts[0] >= sup.MAX_DEATHS + 1  # more deaths than a loop allows
    assert all(exited(p) for p in supervisor.pids())


def test_a_worker_that_dies_while_starting_is_not_restarted(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A model that does not load would fail again: the first start's death ends the run.
    supervisor = ScriptedSupervisor(conf, _config(2), {0: ["600"], 1: ["start-fail"]})
    conf.parent.mkdir(exist_ok=True)
    assert _run(supervisor) == 1
    assert supervisor.starts == {0: 1, 1: 1}
    err = capsys.readouterr().err
    assert "error: worker 1 (pid" in err and "exited with exit status 4 while starting" in err
    assert not sup.all_ready_marker(conf).exists()


def test_ready_only_once_every_worker_is(conf: Path) -> None:
    supervisor = ScriptedSupervisor(conf, _config(2), {0: ["600"], 1: ["600"]})
    conf.parent.mkdir(exist_ok=True)
    seen: list[bool] = []

    def watch() -> None:
        deadline = time.monotonic() + 20
        while not sup.all_ready_marker(conf).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(all(sup.ready_marker(conf, s).exists() for s in (0, 1)))
        supervisor._stop(signal.SIGTERM, None)

    threading.Thread(target=watch, daemon=True).start()
    assert _run(supervisor) == 0
    assert seen == [True]
