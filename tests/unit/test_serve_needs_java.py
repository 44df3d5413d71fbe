"""`pipeline serve` (TorchServe) says it needs Java before starting anything.

Without Java, TorchServe 0.12 prints "java not found" into its own log and exits 0, and
serve used to report only "TorchServe exited with status 0 while starting" and where that
log was; a TorchServe that exits while starting for another reason now shows the log's end.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipeline.runtimes.torchserve.launch import ServeConfig, java_missing, start
from pipeline.runtimes.torchserve.workers import wait_ready
from pipeline.serving.server import ServeError, Server
from tests.unit.test_serve_choice import _mar


def _java(folder: Path) -> Path:
    folder.mkdir(parents=True)
    java = folder / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    return java


def test_java_is_found_on_path_or_in_java_home(tmp_path: Path) -> None:
    _java(tmp_path / "path")
    assert java_missing({"PATH": str(tmp_path / "path")}) is None
    _java(tmp_path / "jdk" / "bin")
    assert java_missing({"PATH": "", "JAVA_HOME": str(tmp_path / "jdk")}) is None


def test_without_java_the_message_says_what_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    why = java_missing({"PATH": str(empty)})
    assert why is not None and "no `java` on PATH and JAVA_HOME is not set" in why
    assert "Java 17" in why and "--runtime kserve" in why
    # JAVA_HOME wins over PATH, as in TorchServe's own launcher.
    _java(tmp_path / "path")
    why = java_missing({"PATH": str(tmp_path / "path"), "JAVA_HOME": str(empty)})
    assert why is not None and f"JAVA_HOME={empty} has no bin/java" in why


def test_serve_refuses_before_starting_torchserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    _mar(tmp_path / "store", "digits_lenet_ts", "digits_lenet")
    config = ServeConfig(store=tmp_path / "store", run_dir=tmp_path / "run")
    with pytest.raises(ServeError, match="TorchServe needs Java 17"):
        start(config)
    assert not (tmp_path / "run").exists() or not os.listdir(tmp_path / "run")


def test_a_torchserve_that_exits_while_starting_shows_the_end_of_its_output(
    tmp_path: Path,
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "torchserve.out").write_text(
        "Removing orphan pid file.\njava not found, please make sure JAVA_HOME is set properly.\n"
    )
    server = Server(
        runtime="torchserve", pid=os.getpid(), run_dir=str(tmp_path),
        inference_url="http://127.0.0.1:9", metrics_url="", models=["m_ts"],
    )  # fmt: skip
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(ServeError) as caught:
        wait_ready(server, proc, timeout=5)
    message = str(caught.value)
    assert "TorchServe exited with status 0 while starting" in message
    assert "java not found, please make sure JAVA_HOME is set properly." in message
