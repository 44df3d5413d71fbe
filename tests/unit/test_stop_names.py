"""`pipeline stop` names the runtime it stopped, with or without serve's record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.runtimes.kserve import CONFIG_FILE
from pipeline.serving.launcher import found_runtime


def test_a_left_over_process_is_named_by_its_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No server.json (a record lost, a killed run), but a process started from the run
    # dir with the KServe runtime's config on its command line, as the runtime is.
    run_dir = tmp_path / "serve"
    run_dir.mkdir()
    marker = str(run_dir.resolve() / CONFIG_FILE)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", marker], start_new_session=True
    )
    try:
        assert found_runtime(run_dir) == "the KServe runtime"
        assert main(["stop", "--run-dir", str(run_dir)]) == 0
        assert (
            f"stopped the KServe runtime (run dir {run_dir.resolve()})" in capsys.readouterr().out
        )
        assert proc.wait(timeout=30) is not None
    finally:
        proc.kill()
        proc.wait()


def test_nothing_running_names_no_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert found_runtime(tmp_path) is None
    assert main(["stop", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"no server was running from {tmp_path.resolve()}" in out
    assert "TorchServe" not in out


def test_a_record_names_its_runtime_even_with_no_process_left(tmp_path: Path) -> None:
    # A stale record (the server died): its runtime is still the one `stop` talks about.
    from pipeline.serving.server import Server

    Server(
        runtime="kserve", pid=0, run_dir=str(tmp_path), inference_url="http://127.0.0.1:1",
        metrics_url="http://127.0.0.1:1", models=[], markers=[CONFIG_FILE],
    ).record()  # fmt: skip
    assert found_runtime(tmp_path) == "the KServe runtime"


def test_stop_on_a_server_that_exited_on_its_own_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record whose server is gone (it crashed, or stopped on a worker's crash loop) is
    not "no record there": stop says the server had exited and where its logs are."""
    from pipeline.serving.server import SERVER_FILE, Server

    Server(
        runtime="kserve", pid=0, run_dir=str(tmp_path), inference_url="http://127.0.0.1:1",
        metrics_url="http://127.0.0.1:1", models=[], markers=[CONFIG_FILE],
    ).record()  # fmt: skip
    assert main(["stop", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the KServe runtime recorded there had exited on its own (logs: " in out, out
    assert "no record there" not in out and not (tmp_path / SERVER_FILE).exists()


def test_stop_says_it_ended_what_an_exited_server_left_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TorchServe's java killed: stop ended its gateway yet said only "no server was
    running"."""
    import subprocess
    import sys

    from pipeline.serving.server import Server

    gateway = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                str(tmp_path / CONFIG_FILE)], start_new_session=True)  # fmt: skip
    try:
        Server(
            runtime="kserve", pid=0, run_dir=str(tmp_path), inference_url="http://127.0.0.1:1",
            metrics_url="http://127.0.0.1:1", models=[], markers=[CONFIG_FILE],
            pids={"gateway": gateway.pid},
        ).record()  # fmt: skip
        assert main(["stop", "--run-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert f"had exited on its own; stopped what it left running (pid {gateway.pid})" in out
        assert gateway.wait(10) is not None
    finally:
        gateway.kill()
        gateway.wait()
