"""The README's commands exist: every `make` target and `pipeline` option it shows."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def _commands() -> list[str]:
    text = "\n".join(BLOCKS).replace("\\\n", " ")
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def test_readme_has_the_two_entry_commands() -> None:
    commands = _commands()
    assert "make demo" in commands
    assert "make test" in commands


@pytest.mark.parametrize("command", [c for c in _commands() if c.startswith("make ")])
def test_make_targets_exist(command: str) -> None:
    target = shlex.split(command)[1]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), target


@pytest.mark.parametrize("command", [c for c in _commands() if c.startswith(".venv/bin/pipeline ")])
def test_pipeline_options_exist(command: str) -> None:
    args = shlex.split(command)[1:]
    words = [a for a in args if not a.startswith("-")]
    path = [words[0]]

    def help_of(path: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipeline", *path, "--help"],
            capture_output=True,
            text=True,
            check=False,
        )

    proc = help_of(path)
    # A stage with sub-commands (`pipeline deploy kserve`) lists them indented in its help.
    if len(words) > 1 and re.search(rf"^\s+{re.escape(words[1])}\s", proc.stdout, flags=re.M):
        path.append(words[1])
        proc = help_of(path)
    assert proc.returncode == 0
    for option in (a for a in args if a.startswith("--")):
        assert option in proc.stdout, f"{option} not in `pipeline {' '.join(path)} --help`"
