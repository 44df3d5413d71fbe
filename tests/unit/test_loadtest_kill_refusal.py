"""`pipeline loadtest --kill-worker-after` against the Ray Serve runtime (a user's trial,
2026-11-29) said the runtime does not replace a killed worker and that "in a cluster,
Kubernetes restarts its pod": untrue, Ray Serve's controller replaces a killed replica
(docs/ray.md). The refusal says so and points to --kill-node-after, in the words of the
runtime's `nodes` capability (no runtime's name is compared outside its package)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.serving import loadtest, runtime
from pipeline.serving.loadtest import LoadConfig, LoadTestError

RAY = "ray"  # the Ray Serve runtime's registered name


@dataclass
class _Server:
    """What run() reads of a recorded server before it sends anything."""

    runtime: str
    run_dir: str = "run"
    models: tuple[str, ...] = ("digits_lenet",)

    def alive(self) -> bool:
        return True


def _refusal(monkeypatch: pytest.MonkeyPatch, name: str, **kills: int) -> str:
    monkeypatch.setattr(loadtest.Server, "load", staticmethod(lambda run_dir: _Server(name)))
    config = LoadConfig(export_dir=Path("unused"), run_dir=Path("run"), requests=100, **kills)
    with pytest.raises(LoadTestError) as refused:
        loadtest.run(config)
    return str(refused.value)


def test_ray_refuses_the_worker_kill_without_denying_that_it_replaces_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = _refusal(monkeypatch, RAY, kill_worker_after=10)
    assert "Kubernetes" not in said and "does not" not in said, said
    assert said.startswith(f"--kill-worker-after is not offered on {runtime.get(RAY).title}: ")
    assert "replaces a killed replica itself" in said and "--kill-node-after" in said, said


def test_a_one_machine_runtime_is_refused_the_node_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    one_machine = next(r for r in runtime.all_runtimes() if r.nodes is None)
    said = _refusal(monkeypatch, one_machine.name, kill_node_after=10)
    assert said.startswith("--kill-node-after needs a runtime spread over a cluster's nodes")
