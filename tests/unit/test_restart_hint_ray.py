"""`pipeline verify --model lstm_tagger --backend ray` against a Ray server serving
my_decision_gate on a cluster joined through $RAY_ADDRESS (a user's trial, 2026-11-29)
said "serve it with `pipeline stop … && pipeline serve --runtime ray --model
my_decision_gate …`": the hint did not add the model verify asked for, and it dropped
the cluster's address, so in a fresh shell it would have started a local cluster."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pipeline.runtimes.ray.constants import STATE_FILE
from pipeline.serving import runtime
from pipeline.serving.server import Server

RAY = "ray"  # the Ray Serve runtime's registered name


def _server(run_dir: Path, *options: str, joined: str | None = None) -> Server:
    state = {"address": joined or "127.0.0.1:6380", "owns_cluster": joined is None}
    (run_dir / STATE_FILE).write_text(json.dumps(state))
    command = ["serve", "--runtime", RAY, *options, "--run-dir", str(run_dir)]
    return Server(RAY, 1, str(run_dir), "http://x", "http://x", ["m"], command=command)


def _serve_step(hint: str) -> list[str]:
    stop, serve = hint.split(" && ")
    assert stop.startswith("pipeline stop --run-dir "), hint
    return shlex.split(serve)


def test_the_hint_adds_the_model_asked_for_and_keeps_the_joined_cluster(tmp_path: Path) -> None:
    server = _server(tmp_path, "--model", "my_decision_gate", joined="10.0.0.5:6379")
    argv = _serve_step(runtime.get(RAY).fix_command("lstm_tagger", server))
    assert argv[:6] == ["pipeline", "serve", "--runtime", RAY, "--model", "my_decision_gate"]
    assert argv[-4:] == ["--model", "lstm_tagger", "--ray-address", "10.0.0.5:6379"], argv


def test_an_address_on_the_command_line_or_a_local_cluster_adds_none(tmp_path: Path) -> None:
    given = _server(tmp_path, "--model", "a", "--ray-address=10.0.0.5:6379", joined="10.0.0.5:6379")
    argv = _serve_step(runtime.get(RAY).fix_command("a", given))  # a stale server's hint
    assert "--ray-address" not in argv and argv.count("--model") == 1, argv
    local = _server(tmp_path, "--model", "a")
    assert "--ray-address" not in runtime.get(RAY).fix_command("b", local)


def test_a_server_of_the_default_model_keeps_serving_it(tmp_path: Path) -> None:
    from pipeline.core.defaults import DEFAULT_MODEL

    argv = _serve_step(runtime.get(RAY).fix_command("lstm_tagger", _server(tmp_path)))
    assert argv[-4:] == ["--model", DEFAULT_MODEL, "--model", "lstm_tagger"], argv


def test_a_model_served_from_an_export_folder_is_not_added_twice(tmp_path: Path) -> None:
    # Started with --ray-export-dir of digits_lenet: the hint appended --model digits_lenet,
    # serving it twice.
    from dataclasses import replace

    from pipeline.serving.provenance import ServedInfo

    server = _server(tmp_path, "--ray-export-dir", "/e/digits")
    server = replace(server, served={"digits_lenet": ServedInfo("digits_lenet", "onnx")})
    argv = _serve_step(runtime.get(RAY).fix_command("digits_lenet", server))
    assert "--model" not in argv, argv
