"""run_cli's forked commands (tests/cli_fork.py) run where and as a plain one would."""

from __future__ import annotations

from pathlib import Path

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
