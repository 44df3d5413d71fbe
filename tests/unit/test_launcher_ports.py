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
