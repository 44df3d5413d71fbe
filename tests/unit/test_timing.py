"""The suite's own time keeping (tests/timing.py): per-module sums, the saved table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import timing


def _report(
    nodeid: str, when: str, duration: float, start: float, cpu: tuple[float, float] = (0, 0)
) -> pytest.TestReport:
    return pytest.TestReport(
        nodeid, ("x.py", 1, "t"), {}, "passed", None, when, [], duration=duration,
        start=start, stop=start + duration,
        user_properties=[("cpu", cpu[0]), ("cpu_waited", cpu[1]), ("other", 7)],
    )  # fmt: skip


class _Outcome:
    def __init__(self, report: pytest.TestReport) -> None:
        self.report = report

    def get_result(self) -> pytest.TestReport:
        return self.report


class _Config:
    def __init__(self, root: Path) -> None:
        self.rootpath = root


def test_module_time_sums_every_phase_and_spans_the_wall_clock(tmp_path: Path) -> None:
    plugin = timing.ModuleTimes(_Config(tmp_path))  # type: ignore[arg-type]
    for nodeid, when, duration, start, cpu in [
        ("tests/a.py::t1", "setup", 5.0, 100.0, (1.0, 3.0)),
        ("tests/a.py::t1", "call", 1.0, 105.0, (0.5, 0.0)),
        ("tests/a.py::t1", "teardown", 0.5, 106.0, (0.25, 0.0)),
        ("tests/a.py::t2", "call", 2.0, 107.0, (2.0, 0.5)),
        ("tests/b.py::t", "call", 0.25, 101.0, (0.0, 0.0)),
    ]:
        plugin.pytest_runtest_logreport(_report(nodeid, when, duration, start, cpu))
    a, b = plugin.modules["tests/a.py"], plugin.modules["tests/b.py"]
    assert (a.setup, a.call, a.teardown, a.total, a.tests) == (5.0, 3.0, 0.5, 8.5, 2)
    assert (a.cpu, a.cpu_waited) == (3.75, 3.5)
    assert (a.start, a.stop) == (100.0, 109.0)
    assert b.total == 0.25 and b.tests == 1
    lines = timing.table(sorted(plugin.modules.values(), key=lambda m: -m.total), total=8.75)
    assert lines[1].split()[0] == "8.5" and lines[1].endswith("tests/a.py")
    assert "0-9" in lines[1] and "1-1" in lines[2]  # seconds after the run's first test
    assert lines[-1].split()[0] == "8.8" and lines[-1].endswith("CPU-seconds 4 + 4 waited")


def test_cpu_times_go_on_each_phase_report_and_count_the_commands_waited_for(
    tmp_path: Path,
) -> None:
    plugin = timing.CpuTimes()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", busy], check=True)  # a child this process reaps
    report = _report("tests/a.py::t", "call", 1.0, 0.0)
    report.user_properties.clear()
    wrapper = plugin.pytest_runtest_makereport(None, None)  # type: ignore[arg-type]
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(_Outcome(report))
    got = dict(report.user_properties)
    assert got["cpu_waited"] >= 0.3 and got["cpu"] >= 0.0


def test_the_saved_table_prints_again_and_a_missing_one_says_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "module_times.json"
    assert timing.main([str(saved)]) == 1
    assert "run `make test`" in capsys.readouterr().err
    module = timing.Module("tests/c.py", worker="gw1", tests=3, call=4.0, start=1.0, stop=5.0)
    saved.write_text(json.dumps([timing._saved(module)]))
    fixtures = [{"fixture": "family", "scope": "session", "seconds": 71.2, "worker": "gw1",
                 "module": ""}]  # fmt: skip
    (tmp_path / "fixture_times.json").write_text(json.dumps(fixtures))
    assert timing.main([str(saved)]) == 0
    out = capsys.readouterr().out
    assert "tests/c.py" in out and "gw1" in out and "4.0 worker-seconds in all" in out
    assert "71.2" in out and "family" in out


def test_fixture_rows_gather_every_worker_longest_first(tmp_path: Path) -> None:
    for worker, seconds in (("gw0", 3.0), ("gw1", 40.0)):
        row = {"fixture": "f", "scope": "module", "seconds": seconds, "worker": worker,
               "module": "tests/m.py"}  # fmt: skip
        (tmp_path / f"fixture-times-{worker}.jsonl").write_text(json.dumps(row) + "\n")
    assert [r["worker"] for r in timing.fixture_rows(tmp_path)] == ["gw1", "gw0"]
    assert "(tests/m.py)" in timing.fixture_table(timing.fixture_rows(tmp_path))[1]
