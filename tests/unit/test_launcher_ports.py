"""Ports a start was asked to use are never handed out again as its internal ports."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from pipeline.serving import launcher


def test_ports_asked_for_are_not_picked_as_internal_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = launcher.free_port()
    launcher._HANDED_OUT.discard(asked)  # as in a fresh `pipeline serve --port ASKED`
    launch = launcher.Launch(
        title="a test", run_dir=tmp_path, host="127.0.0.1", ports=[("127.0.0.1", asked, "--port")]
    )
    launcher.prepare(launch)
    other = launcher.free_port()
    launcher._HANDED_OUT.discard(other)
    # The draw offers the asked port first: it is still free (nothing bound it yet), yet
    # free_port passes over it. Before the fix TorchServe's gRPC server took it.
    monkeypatch.setattr(random, "sample", lambda population, k: [asked, other])
    assert launcher.free_port() == other


def test_a_busy_port_asked_for_is_refused_with_the_option_to_change(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        launch = launcher.Launch(
            title="a test", run_dir=tmp_path, host="127.0.0.1",
            ports=[("127.0.0.1", busy, "--port"), ("127.0.0.1", busy + 1, "--metrics-port")],
        )  # fmt: skip
        with pytest.raises(launcher.ServeError, match=f"Port {busy} on 127.0.0.1 is in use; "
                           "pick others with --port/--metrics-port"):  # fmt: skip
            launcher.prepare(launch)


def test_ports_come_from_the_range_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(launcher.PORTS_ENV, "23000-23009")
    picked = {launcher.free_port() for _ in range(3)}
    launcher._HANDED_OUT.difference_update(picked)
    assert len(picked) == 3 and picked <= set(range(23000, 23010))


@pytest.mark.parametrize("spec", ["23000", "9-20", "23010-23000", "a-b", "60000-70000"])
def test_a_bad_port_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv(launcher.PORTS_ENV, spec)
    with pytest.raises(launcher.ServeError, match="expected LOW-HIGH within 1024-65535"):
        launcher.free_port()


def test_a_port_whose_last_connection_waits_in_time_wait_is_free_a_listening_one_is_not() -> None:
    """`pipeline stop` closing a kept-alive client leaves the server's side in TIME-WAIT for
    up to 60 s; `serve` on the same port called it "in use" though nothing listened, and
    the restart the docs prescribe (stop, then serve) failed (a user's trial, 2026-11-28)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.listen()
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    assert not launcher.port_free("127.0.0.1", port)  # a server listens there
    accepted.close()  # the server's side closes first: its end goes to TIME-WAIT
    client.close()
    listener.close()
    assert launcher.port_free("127.0.0.1", port)
    # What the servers do next: bind and listen there, as asyncio and the JVM do.
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_one_port_for_two_listeners_is_refused(tmp_path: Path) -> None:
    """`--port 19085 --grpc-port 19085`: both bound (SO_REUSEPORT), the server said it was
    up, and gRPC clients never reached it."""
    port = launcher.free_port()
    launch = launcher.Launch(
        title="a test", run_dir=tmp_path, host="127.0.0.1",
        ports=[("127.0.0.1", port, "--port"), ("127.0.0.1", port, "--grpc-port")],
    )  # fmt: skip
    with pytest.raises(launcher.ServeError, match=f"--port and --grpc-port are both {port}"):
        launcher.prepare(launch)


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--port", "0"], ["--max-request-size", "-1"],
                                  ["--workers-per-model", "0"], ["--threads-per-worker", "0"],
                                  ["--runtime", "kserve", "--max-batch-delay-ms", "-1"]])  # fmt: skip
def test_a_value_out_of_range_is_a_usage_error_naming_the_option(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--port 70000 ended in an OverflowError traceback, --max-request-size -1 in a Java
    stack, --workers-per-model 0 was ignored and --port 0 never returned."""
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", *argv])
    assert exited.value.code == 2
    assert f"error: argument {argv[-2]}: {argv[-1]} " in capsys.readouterr().err


def test_a_server_already_running_is_named_with_the_stop_for_its_folder(tmp_path: Path) -> None:
    """The hint said `pipeline stop`, which stops the default folder's server."""
    import subprocess
    import sys

    from pipeline.serving.server import Server

    marker = tmp_path / "kserve.json"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(marker)],
                            start_new_session=True)  # fmt: skip
    try:
        Server(runtime="kserve", pid=proc.pid, run_dir=str(tmp_path), inference_url="",
               metrics_url="", models=[], markers=["kserve.json"]).record()  # fmt: skip
        launch = launcher.Launch(title="a test", run_dir=tmp_path, host="127.0.0.1", ports=[])
        with pytest.raises(launcher.ServeError, match=f"`pipeline stop --run-dir {tmp_path}`"):
            launcher.prepare(launch)
    finally:
        proc.kill()
        proc.wait()
