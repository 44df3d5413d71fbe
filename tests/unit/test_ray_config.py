"""The Ray runtime's options into its config, the replicas' CPU shares, the stacking of a
batch's requests, and loadtest's node-loss arithmetic: in process, no cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from pipeline.runtimes.ray import RayServe
from pipeline.runtimes.ray.launch import RayConfig, replica_cpus
from pipeline.serving.loadkills import NodeKill as _NodeKill
from pipeline.serving.loadtest import LoadConfig, LoadTestError


def _own(**kw: object) -> argparse.Namespace:
    base = {
        "ray_address": None,
        "ray_nodes": 0,
        "ray_node_cpus": None,
        "ray_replicas": 1,
        "ray_min_replicas": None,
        "ray_max_replicas": None,
        "ray_max_batch_size": 8,
        "ray_batch_wait_ms": 0.0,
        "ray_replica_cpus": None,
        "ray_replica_gpus": 0.0,
    }
    return argparse.Namespace(**(base | kw))


def _config(**kw: object) -> RayConfig:
    return RayServe._config(_own(**kw), None, ValueError)


def test_options_become_the_config() -> None:
    one = _config()
    assert one.worker_nodes == 0 and one.node_cpus >= 1 and one.max_replicas_per_node is None
    spread = _config(ray_nodes=2, ray_replicas=2)
    assert spread.node_cpus == 1 and spread.max_replicas_per_node == 1  # one per worker node
    assert _config(ray_nodes=1, ray_replicas=2).max_replicas_per_node is None  # would not fit
    scaled = _config(ray_min_replicas=0, ray_max_replicas=4)
    assert scaled.autoscaling == {"min_replicas": 0, "max_replicas": 4, "initial_replicas": 1}
    assert _config(ray_max_replicas=3).autoscaling["min_replicas"] == 1
    assert one.replica_gpus == 0.0 and _config(ray_replica_gpus=0.5).replica_gpus == 0.5


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"ray_nodes": -1}, "--ray-nodes must be 0 or more"),
        ({"ray_replicas": 0}, "--ray-replicas"),
        ({"ray_max_batch_size": 0}, "--ray-max-batch-size"),
        ({"ray_replica_cpus": -0.5}, "--ray-replica-cpus must be 0 or more"),
        ({"ray_replica_gpus": -1.0}, "--ray-replica-gpus must be 0 or more"),
        ({"ray_address": "127.0.0.1:6379", "ray_nodes": 2}, "with --ray-address"),
        ({"ray_min_replicas": 3, "ray_max_replicas": 2}, "Autoscaling needs"),
    ],
)
def test_bad_options_are_refused_saying_which(kw: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        _config(**kw)


def test_replicas_share_the_local_clusters_cpus_when_they_outnumber_them() -> None:
    models = [{"name": f"m{i}"} for i in range(3)]
    assert replica_cpus(RayConfig(models=models, node_cpus=2)) == pytest.approx(2 / 3)
    assert replica_cpus(RayConfig(models=models[:1], node_cpus=2)) == 1.0
    two_nodes = RayConfig(models=models[:1], worker_nodes=2, node_cpus=1, replicas=2)
    assert replica_cpus(two_nodes) == 1.0
    assert replica_cpus(RayConfig(models=models, address="127.0.0.1:1")) == 1.0  # joined
    assert replica_cpus(RayConfig(models=models, replica_cpus_asked=0.0)) == 0.0


def test_requests_stack_only_when_their_other_dimensions_agree() -> None:
    from pipeline.runtimes.ray.app import groups

    axes = {"x": 0}
    reqs = [{"x": np.zeros((1, 3))}, {"x": np.zeros((2, 3))}, {"x": np.zeros((1, 4))}]
    assert groups(reqs, axes) == [[0, 1], [2]]
    seq = {"tokens": 1}  # batch on axis 1: axis 0 must agree
    reqs = [
        {"tokens": np.zeros((5, 1))},
        {"tokens": np.zeros((5, 2))},
        {"tokens": np.zeros((6, 1))},
    ]
    assert groups(reqs, seq) == [[0, 1], [2]]


def test_node_loss_recovery_is_the_first_answer_after_the_last_failure() -> None:
    kill = _NodeKill()
    assert kill.recovery_s() is None  # no kill, no figure
    kill.at = 100.0
    kill.answered_at = [100.5, 101.0, 104.0]
    assert kill.recovery_s() == pytest.approx(0.5)  # nothing failed: the first answer
    kill.last_failure = 102.0
    assert kill.recovery_s() == pytest.approx(4.0)
    kill.last_failure = 105.0
    assert kill.recovery_s() is None  # never answered again


def test_kill_node_after_is_checked_like_kill_worker_after() -> None:
    config = LoadConfig(export_dir=Path("."), requests=10, kill_node_after=10)
    with pytest.raises(LoadTestError, match="--kill-node-after must be between"):
        config.validate()
    both = LoadConfig(export_dir=Path("."), requests=10, kill_node_after=1, kill_worker_after=1)
    with pytest.raises(LoadTestError, match="not both"):
        both.validate()


def test_a_request_the_model_cannot_take_fails_alone_not_its_batch() -> None:
    """serve.batch hands an exception raised by the batch to every request in it: one
    token id past the vocabulary failed the requests stacked with it."""
    import asyncio

    from pipeline.runtimes.ray.app import Model

    def forward(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        if (batch["x"] < 0).any():
            raise ValueError("indices element out of data bounds")
        return [batch["x"] * 2]

    replica = object.__new__(Model.func_or_class)  # a replica's state, without loading
    replica.forward, replica.axes, replica.output_axes, replica.stack = forward, {"x": 0}, [0], True

    # The batch as serve.batch hands it over (its queue needs a running replica).
    batched = Model.func_or_class.batched.__wrapped__
    xs = [np.full((1, 2), v, np.float32) for v in (1.0, -1.0, 3.0)]
    first, bad, third = asyncio.run(batched(replica, [{"x": x} for x in xs]))
    assert isinstance(bad, ValueError), bad  # __call__ raises it for its own request
    np.testing.assert_array_equal(first[0], np.full((1, 2), 2.0, np.float32))
    np.testing.assert_array_equal(third[0], np.full((1, 2), 6.0, np.float32))


def test_a_cluster_address_that_answers_nothing_is_said_at_once(tmp_path: Path) -> None:
    """`serve --runtime ray --ray-address 127.0.0.1:PORT` with nothing there printed nothing
    for four minutes (ray.init retrying), then a wall of Ray's logs."""
    from pipeline.runtimes.ray.launch import start
    from pipeline.serving.launcher import free_port
    from pipeline.serving.server import ServeError

    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServeError, match=f"Cannot reach the Ray cluster at {address}"):
        start(RayConfig(models=[{"name": "m"}], address=address), tmp_path, {})
    assert not (tmp_path / "server.json").exists()  # refused before anything was started


def test_serves_deployment_messages_are_said_on_one_line_with_what_to_do() -> None:
    """What the host logs while its application deploys (pipeline/runtimes/ray/deploying.py):
    a replica's traceback as its first and last lines; an unplaced replica with the fix."""
    from pipeline.runtimes.ray.deploying import UNPLACED_HINT, explained, short

    failed = (
        "The deployment failed to start 3 times in a row. See controller logs.\n"
        'Traceback (most recent call last):\n  File "app.py", line 1, in load\n'
        "pipeline.core.errors.ArtifactError: model.onnx was modified after export\n"
    )
    said = short(failed)
    assert "\n" not in said and said.startswith("The deployment failed to start")
    assert said.endswith("ArtifactError: model.onnx was modified after export"), said
    assert UNPLACED_HINT not in explained(failed)
    waiting = (
        "Deployment 'model-digits_lenet' in application 'pipeline-40b35517' has 1 replicas "
        "that have taken more than 30s to be scheduled. Resources required for each "
        'replica: {"CPU": 1.0}, total resources available: {}.'
    )
    assert explained(waiting).endswith(f"({UNPLACED_HINT})")
    assert "--ray-replica-cpus 0" in UNPLACED_HINT


def test_the_other_proxy_note_is_for_another_proxy_not_for_the_runs_own_path() -> None:
    # Every joined run printed "the cluster's Serve proxy was already running", also the
    # one that started Serve on --port: the URLs compared held the run's path.
    from pipeline.runtimes.ray.launch import elsewhere

    asked = "http://127.0.0.1:24080"
    assert not elsewhere(f"{asked}/pipeline-40b35517", asked)
    assert not elsewhere(asked, asked)
    assert elsewhere("http://127.0.0.1:8000/pipeline-40b35517", asked)
    assert not elsewhere("http://127.0.0.1:24080/pipeline-40b35517", "http://0.0.0.0:24080")


def test_a_wrong_count_names_only_its_own_option() -> None:
    # --ray-replicas 0 said "--ray-nodes must be 0 or more; --ray-replicas and
    # --ray-max-batch-size at least 1", naming two options the user had not given.
    with pytest.raises(ValueError, match=r"^--ray-replicas must be at least 1; got 0\.$"):
        _config(ray_replicas=0)
