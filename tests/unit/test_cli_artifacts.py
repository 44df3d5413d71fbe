"""--artifacts-dir is the default of every lookup a command makes: `serve --runtime kserve`
and `loadtest --serve` read bench's fastest.json from ./artifacts whatever the option said
(a user's trial): the lookups that take no folder read $PIPELINE_ARTIFACTS, which the CLI
now sets for the command (and the processes it starts) and restores after it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.core import paths


def test_a_command_sees_its_artifacts_dir_everywhere_and_leaves_the_environment_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Path] = []

    def where(args: argparse.Namespace) -> int:
        seen.append(paths.fastest_path(None))  # a lookup given no folder
        return 0

    monkeypatch.setattr(cli, "_cmd_where", where)
    monkeypatch.delenv(paths.ARTIFACTS_ENV, raising=False)
    assert cli.main(["--artifacts-dir", str(tmp_path / "art"), "where", "--what", "export"]) == 0
    assert seen == [paths.fastest_path(tmp_path / "art")]
    assert paths.ARTIFACTS_ENV not in os.environ
    monkeypatch.setenv(paths.ARTIFACTS_ENV, "/elsewhere")
    assert cli.main(["where", "--what", "export"]) == 0
    assert seen[-1] == paths.fastest_path(Path("/elsewhere"))
    assert cli.main(["--artifacts-dir", str(tmp_path), "where", "--what", "export"]) == 0
    assert os.environ[paths.ARTIFACTS_ENV] == "/elsewhere"
