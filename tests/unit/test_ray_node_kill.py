"""`loadtest --kill-node-after` on the Ray runtime (a user's trial, 2026-11-29): after one
node was lost, a second run killed the only node left serving the model (104 answered, 8
failed with 5xx, never answering again); and `loadtest --serve --runtime ray` started a
head-only cluster (46 s) before it refused, advising a --ray-nodes loadtest lacks. A node
is killed only while at least two worker nodes serve the model, and both refusals come
before any load is sent or any server started."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.runtimes.ray.constants import STATE_FILE
from pipeline.serving import loadtest, runtime
from pipeline.serving.loadtest import LoadConfig, LoadTestError

RAY = "ray"
MODEL = "digits_lenet"


@dataclass
class _Server:
    """What run() and the Ray runtime's node kill read of a recorded server."""

    run_dir: str
    runtime: str = RAY
    models: tuple[str, ...] = (MODEL,)

    def alive(self) -> bool:
        return True


@pytest.fixture
def raylets() -> Any:
    """Stand-ins for worker nodes' raylets: processes this test started, and ends."""
    started: list[subprocess.Popen] = []

    def start() -> int:
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return started[-1].pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _state(tmp_path: Path, workers: list[tuple[str, int, bool]]) -> _Server:
    """A ray_state.json whose worker nodes (id, raylet pid, marked dead) each hold a
    replica of MODEL, beside a head that holds none."""
    nodes = [{"node_id": "head", "head": True, "raylet_pid": None, "pids": {}}]
    nodes += [
        {"node_id": n, "head": False, "raylet_pid": pid, "pids": {"raylet": [pid]}, "dead": dead}
        for n, pid, dead in workers
    ]
    state = {
        "owns_cluster": True,
        "address": "127.0.0.1:1",
        "nodes": nodes,
        "replicas": {MODEL: [{"pid": 1, "node_id": n} for n, _, _ in workers]},
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    return _Server(str(tmp_path))


def _refused_run(monkeypatch: pytest.MonkeyPatch, server: _Server) -> str:
    monkeypatch.setattr(loadtest.Server, "load", staticmethod(lambda run_dir: server))

    def no_load(*args: Any) -> None:
        raise AssertionError("load was sent before the refusal")

    monkeypatch.setattr(loadtest, "_run", no_load)
    config = LoadConfig(
        export_dir=Path("unused"), run_dir=Path("run"), served=MODEL, kill_node_after=10
    )
    with pytest.raises(LoadTestError) as refused:
        loadtest.run(config, exported=object())  # type: ignore[arg-type]
    return str(refused.value)


def test_the_last_live_worker_node_is_not_killed_and_the_run_is_refused_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raylets: Any
) -> None:
    alive = raylets()
    # Two recorded, one of them lost before this run (marked by the host, or its raylet gone).
    server = _state(tmp_path, [("lost", alive, True), ("left", alive, False)])
    said = _refused_run(monkeypatch, server)
    assert said.startswith("--kill-node-after: 1 worker node(s) serve digits_lenet"), said
    assert "--ray-nodes 2" in said and "loadtest against it" in said, said
    nodes = runtime.get(RAY).nodes
    with pytest.raises(ValueError, match="1 worker node"):
        nodes.kill_node(server, MODEL)  # type: ignore[union-attr]
    assert subprocess.run(["kill", "-0", str(alive)]).returncode == 0  # not killed


def test_a_node_whose_raylet_is_gone_does_not_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raylets: Any
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    server = _state(tmp_path, [("a", raylets(), False), ("b", gone.pid, False)])
    assert runtime.get(RAY).nodes.worker_nodes(server, MODEL) == ["a"]  # type: ignore[union-attr]
    assert "1 worker node(s)" in _refused_run(monkeypatch, server)


def test_with_two_live_worker_nodes_one_of_them_is_killed(tmp_path: Path, raylets: Any) -> None:
    first, second = raylets(), raylets()
    server = _state(tmp_path, [("a", first, False), ("b", second, False)])
    nodes = runtime.get(RAY).nodes
    assert nodes.worker_nodes(server, MODEL) == ["a", "b"]  # type: ignore[union-attr]
    assert nodes.kill_node(server, MODEL) == "a"  # type: ignore[union-attr]
    deadline = time.monotonic() + 10  # SIGKILL is delivered, not awaited
    while nodes.worker_nodes(server, MODEL) != ["b"] and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.05)
    assert nodes.worker_nodes(server, MODEL) == ["b"]  # type: ignore[union-attr]
    assert subprocess.run(["kill", "-0", str(second)]).returncode == 0


def test_loadtest_serve_refuses_the_node_kill_before_starting_a_private_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt = runtime.get(RAY)

    def private(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a private server was started before the refusal")

    monkeypatch.setattr(rt, "private", private)
    config = LoadConfig(export_dir=Path("unused"), requests=100, kill_node_after=50, runtime=RAY)
    with pytest.raises(LoadTestError) as refused:
        loadtest.run_served(config, private=True)
    said = str(refused.value)
    assert said.startswith("--kill-node-after with --serve: "), said
    # Advice that can be followed: loadtest has no --ray-nodes; serve has.
    assert "pipeline serve --runtime ray --ray-nodes 2" in said and "without --serve" in said
    assert "start the runtime with --ray-nodes" not in said
