"""run_cli's forked commands (tests/cli_fork.py) run where and as a plain one would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import cli_fork
from tests.conftest import run_cli

USER_FILE = "import torch\n\n\nclass Mine(torch.nn.Module):\n    pass\n"


def test_a_forked_command_runs_in_its_folder_and_says_what_a_plain_one_says(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine.py").write_text(USER_FILE)
    cpu_before = cli_fork.Forker.cpu_s
    forked = run_cli("export", "--model", "mine.py:Nope", cwd=tmp_path)
    assert cli_fork._forker is not None  # the fork served it
    assert cli_fork.Forker.cpu_s > cpu_before  # its CPU time is counted (tests/timing.py)
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
    monkeypatch.setenv("PIPELINE_TESTS_DRIFT", "1")
    cpu_before = cli_fork.Forker.cpu_s
    proc = run_cli("export", "--model", "mine.py:Nope", cwd=tmp_path)
    assert proc.returncode == 1 and "does not exist" in proc.stderr, proc.stderr
    assert cli_fork.Forker.cpu_s > cpu_before  # forked, not a plain subprocess
    assert cli_fork._forker is not first and first is not None
    assert first.proc.poll() is not None  # the old one was closed
    assert cli_fork._forker.env["PIPELINE_TESTS_DRIFT"] == "1"
