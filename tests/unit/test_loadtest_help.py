"""`pipeline loadtest --help` said it "Exits 1 if any request failed or was wrong", while a
run --time-limit ended with 0 failed and 0 wrong exits 1 (by design: it checked fewer
requests than asked). The help says so."""

from __future__ import annotations

import contextlib
import io

import pytest

from pipeline.cli import main


def test_the_help_says_a_run_the_time_limit_ends_exits_1() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["loadtest", "--help"])
    said = " ".join(out.getvalue().split())
    assert "Exits 1 if any request failed, was wrong or got a 5xx, or if --time-limit ended" in said
    assert "a run it ends before every request was sent fails" in said, said
