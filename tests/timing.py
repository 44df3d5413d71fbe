"""Where the suite's time goes: worker-seconds per test module, measured on every run.

A pytest plugin (tests/conftest.py loads it). It sums each module's setup, call and
teardown time as the reports arrive (under pytest-xdist, on the controller, which
receives every worker's reports), notes which worker ran it and when it started and
ended, prints the longest modules at the end of the run and writes every module to
`.pytest_cache/module_times.json`. `python -m tests.timing` (`make test-times`) prints
that file again as a table: the last run's modules, longest first, with the wall
clock's span of each, so a module that ran alone at the end (the run's tail) shows.

A module-scoped fixture's cost falls on the module's first test, and a session fixture
shared between workers (`tests/conftest.py`'s `shared`) on the first module that asked
for it: tests/README.md says which module that is for each.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from tests import cli_fork

RESULT = Path(".pytest_cache") / "module_times.json"
FIXTURES = Path(".pytest_cache") / "fixture_times.json"
SHOWN = 15  # modules printed at the end of a run; the file has them all
SLOW_FIXTURE_S = 1.0  # module and session fixtures taking longer are recorded


@dataclass
class Module:
    """One test module's time: worker-seconds by phase, and its span on the wall clock."""

    path: str
    worker: str = "-"
    tests: int = 0
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    start: float = field(default=float("inf"))
    stop: float = 0.0
    cpu: float = 0.0  # CPU-seconds of the worker process itself
    cpu_waited: float = 0.0  # of the commands it started and waited for (forked ones too)

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


class ModuleTimes:
    """The plugin: one Module per test file, filled from the run's reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rootdir = config.rootpath
        self.modules: dict[str, Module] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        module = self.modules.setdefault(path, Module(path))
        setattr(module, report.when, getattr(module, report.when) + report.duration)
        module.tests += report.when == "call" or (report.when == "setup" and report.skipped)
        node = getattr(report, "node", None)  # the xdist worker, on the controller
        if node is not None:
            module.worker = node.gateway.id
        for key, value in report.user_properties:
            if key in CPU_KEYS:
                setattr(module, key, getattr(module, key) + value)
        if report.start:
            module.start = min(module.start, report.start)
            module.stop = max(module.stop, report.stop)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.modules:
            return
        rows = sorted(self.modules.values(), key=lambda m: -m.total)
        out = self.rootdir / RESULT
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps([_saved(m) for m in rows], indent=1) + "\n")
        terminalreporter.write_sep("=", f"worker time per module (the {SHOWN} longest)")
        for line in table(rows[:SHOWN], total=sum(m.total for m in rows)):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"every module: {out} (make test-times prints it)")
        fixtures = fixture_rows(run_folder(self.config))
        (self.rootdir / FIXTURES).write_text(json.dumps(fixtures, indent=1) + "\n")
        if fixtures:
            terminalreporter.write_sep("=", f"the {SHOWN} longest fixture setups")
            for line in fixture_table(fixtures[:SHOWN]):
                terminalreporter.write_line(line)


class FixtureTimes:
    """In each worker (or a run without xdist): the setup time of every module or session
    fixture over SLOW_FIXTURE_S, appended to one file per worker in the run's temp root,
    which ModuleTimes gathers at the end. A session fixture another worker is building
    shows here too, as the time this worker waited for it (`shared`'s lock)."""

    def __init__(self, config: pytest.Config, worker: str) -> None:
        self.config = config
        self.worker = worker

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
        began = time.perf_counter()
        yield
        took = time.perf_counter() - began
        if fixturedef.scope in ("module", "session") and took >= SLOW_FIXTURE_S:
            module = request.node.nodeid.split("::", 1)[0] if fixturedef.scope == "module" else ""
            row = {"fixture": fixturedef.argname, "scope": fixturedef.scope, "seconds": took,
                   "worker": self.worker, "module": module}  # fmt: skip
            path = run_folder(self.config) / f"fixture-times-{self.worker}.jsonl"
            with path.open("a") as out:
                out.write(json.dumps(row) + "\n")


CPU_KEYS = ("cpu", "cpu_waited")


class CpuTimes:
    """In each process that runs tests: the CPU time each test phase took, put on its
    report (`user_properties`, which xdist sends to the controller). Wall time alone
    cannot say where a CPU-bound suite's work goes: a worker waiting on another's
    `shared` build, or on a server, shows wall time and no CPU. `cpu_waited` counts
    the children this process reaped (subprocess.run's commands, torchrun, CMake and
    the compilers under it, DataLoader workers) and run_cli's forked commands; it
    misses servers' own processes, which are not this process's children (TorchServe
    daemonises) or are killed rather than waited for."""

    def __init__(self) -> None:
        self.last = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        waited = children.ru_utime + children.ru_stime + cli_fork.Forker.cpu_s
        return time.process_time(), waited

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        now = self._now()
        own, waited = (b - a for a, b in zip(self.last, now, strict=True))
        self.last = now
        outcome.get_result().user_properties.extend([("cpu", own), ("cpu_waited", waited)])


def fixture_rows(folder: Path) -> list[dict[str, object]]:
    """Every worker's slow fixtures, longest first."""
    rows = [
        json.loads(line)
        for path in sorted(folder.glob("fixture-times-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return sorted(rows, key=lambda r: -float(r["seconds"]))


def _saved(module: Module) -> dict[str, object]:
    saved = asdict(module)
    saved["total"] = module.total
    return saved


def table(rows: list[Module], total: float) -> list[str]:
    """Worker-seconds per module, and when each ran (seconds after the run's first test)."""
    began = min((m.start for m in rows), default=0.0)
    lines = [
        f"{'worker s':>9} {'setup s':>8} {'cpu s':>6} {'+waited':>7} {'tests':>5}  "
        f"{'worker':6} {'ran (s)':>13}  module"
    ]
    for m in rows:
        span = f"{m.start - began:5.0f}-{m.stop - began:<5.0f}" if m.stop else ""
        lines.append(
            f"{m.total:9.1f} {m.setup:8.1f} {m.cpu:6.0f} {m.cpu_waited:7.0f} {m.tests:5d}  "
            f"{m.worker:6} {span:>13}  {m.path}"
        )
    cpu = sum(m.cpu for m in rows), sum(m.cpu_waited for m in rows)
    lines.append(
        f"{total:9.1f} worker-seconds in all; CPU-seconds {cpu[0]:.0f} + {cpu[1]:.0f} waited"
    )
    return lines


def fixture_table(rows: list[dict[str, object]]) -> list[str]:
    lines = [f"{'seconds':>8}  {'worker':6} {'scope':7}  fixture (module)"]
    for r in rows:
        where = f" ({r['module']})" if r["module"] else ""
        lines.append(f"{r['seconds']:8.1f}  {r['worker']:6} {r['scope']:7}  {r['fixture']}{where}")
    return lines


def run_folder(config: pytest.Config) -> Path:
    """The run's temp root: under xdist a worker's basetemp is the controller's / worker id."""
    basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return basetemp.parent if hasattr(config, "workerinput") else basetemp


def register(config: pytest.Config) -> None:
    """The controller gathers; every process that runs tests times its fixtures."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        config.pluginmanager.register(FixtureTimes(config, worker), "fixture-times")
        config.pluginmanager.register(CpuTimes(), "cpu-times")
        return
    config.pluginmanager.register(ModuleTimes(config), "module-times")
    if getattr(config.option, "dist", "no") == "no":
        config.pluginmanager.register(FixtureTimes(config, "main"), "fixture-times")
        config.pluginmanager.register(CpuTimes(), "cpu-times")


def main(argv: list[str]) -> int:
    """Print the last run's module times (`make test-times`)."""
    path = Path(argv[0]) if argv else RESULT
    if not path.is_file():
        print(f"error: {path} does not exist: run `make test` (or pytest) first", file=sys.stderr)
        return 1
    saved = json.loads(path.read_text())
    rows = [Module(**{k: v for k, v in m.items() if k != "total"}) for m in saved]
    for line in table(rows, total=sum(m.total for m in rows)):
        print(line)
    fixtures = path.parent / FIXTURES.name
    if fixtures.is_file():
        print()
        for line in fixture_table(json.loads(fixtures.read_text())):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
