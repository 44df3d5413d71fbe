"""run_cli's forked commands (tests/cli_fork.py) run where and as a plain one would."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from tests import cli_fork
from tests.conftest import run_cli

USER_FILE = "import torch\n\n\nclass Mine(torch.nn.Module):\n    pass\n"


def test_a_forked_command_runs_in_its_folder_and_says_what_a_plain_one_says(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine.py").write_text(USER_FILE)
    previous = cli_fork._forker
    before = previous.reported if previous else 0.0
    forked = run_cli("export", "--model", "mine.py:Nope", cwd=tmp_path)
    forker = cli_fork._forker
    assert forker is not None  # the fork served it
    # Its CPU time is counted (tests/timing.py reads Forker.cpu_s, which gains what the
    # forking process reports). Compared on the forker that ran it: when the worker's
    # environment drifted, the old one was replaced and its share moved out of cpu_s.
    assert forker.reported > (before if forker is previous else 0.0)
    # The file was found relative to the command's folder, not the forking process's.
    assert forked.returncode == 1, forked.stderr
    assert "mine.py has no torch.nn.Module subclass named 'Nope'" in forked.stderr
    plain = run_cli("export", "--model", "mine.py:Nope", cwd=tmp_path, env={cli_fork.OFF: "1"})
    assert (plain.returncode, plain.stdout, plain.stderr) == (
        forked.returncode,
        forked.stdout,
        forked.stderr,
    )


def test_a_changed_worker_environment_gets_a_new_forking_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that sets a variable in the test process (torch's AOTInductor does) once
    sent every later command to a plain subprocess; now the forking process is replaced."""
    run_cli("export", "--model", "mine.py:Nope", cwd=tmp_path)
    first = cli_fork._forker
    assert first is not None and first.reported > 0
    counted, cpu_before, reaped_before = first.reported, cli_fork.Forker.cpu_s, _reaped_cpu()
    monkeypatch.setenv("PIPELINE_TESTS_DRIFT", "1")
    proc = run_cli("export", "--model", "mine.py:Nope", cwd=tmp_path)
    assert proc.returncode == 1 and "does not exist" in proc.stderr, proc.stderr
    assert cli_fork._forker is not first
    assert cli_fork._forker.reported > 0  # forked, not a plain subprocess
    assert first.proc.poll() is not None  # the old one was closed
    assert cli_fork._forker.env["PIPELINE_TESTS_DRIFT"] == "1"
    # Reaped, the old one brought its commands' CPU into RUSAGE_CHILDREN (it waited for
    # them): tests/timing.py counts it there, no longer in cpu_s as well.
    assert _reaped_cpu() - reaped_before >= counted - 0.01
    assert cli_fork.Forker.cpu_s == pytest.approx(cpu_before - counted + cli_fork._forker.reported)


def _reaped_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
