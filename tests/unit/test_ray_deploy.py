"""`pipeline deploy ray`'s RayService and Serve config, checked against KubeRay's CRD schema
(vendored, strict about unknown fields); the checks can fail."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml

from pipeline.runtimes.ray import deploy as d

MODEL = {
    "name": "digits_lenet",
    "export_dir": "/x",
    "format": "onnx",
    "version": None,
    "platform": "onnxruntime_onnx",
}


def _config(**kw) -> d.RayDeployConfig:
    c = d.RayDeployConfig(model="digits_lenet", export_dir=Path("/x"), out=Path("/o"), **kw)
    c.name, c.image = c.name or d.service_name(c.model), c.image or "img:1"
    return c


def test_the_rayservice_is_valid_and_runs_the_runtimes_application() -> None:
    manifest = d.rayservice(_config(), MODEL)
    assert d.errors(manifest) == []
    serve = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    module, attr = app["import_path"].split(":")
    assert callable(getattr(importlib.import_module(module), attr))  # what Serve imports
    args = app["args"]
    assert args["models"][0]["export_dir"] == d.EXPORT_IN_IMAGE  # the image's copy
    assert args["token_file"].startswith(d.TOKEN_DIR) and args["max_replicas_per_node"] == 1
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == d.RAY_VERSION
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 2
    assert "enableInTreeAutoscaling" not in cluster
    scaled = d.rayservice(_config(max_workers=5), MODEL)
    assert d.errors(scaled) == [] and scaled["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"]


@pytest.mark.parametrize(
    ("where", "field"),
    [
        (("spec", "rayClusterConfig", "workerGroupSpecs", 0), "replica"),
        (
            ("spec", "rayClusterConfig", "headGroupSpec", "template", "spec", "containers", 0),
            "volumeMount",
        ),
        (("spec",), "serveConfig"),
    ],
)
def test_a_misspelt_field_is_refused(where: tuple, field: str) -> None:
    manifest = d.rayservice(_config(), MODEL)
    node = manifest
    for key in where:
        node = node[key]
    node[field] = 1
    found = d.errors(manifest)
    assert len(found) == 1 and f"'{field}' was unexpected" in found[0], found
    with pytest.raises(d.DeployError, match="not a valid KubeRay RayService"):
        d.check(manifest)


def test_names_and_kinds_are_checked() -> None:
    assert d.service_name("digits_lenet") == "digits-lenet"
    assert d.service_name("models/my_model.py:MyModel")[:1].isalpha()
    manifest = d.rayservice(_config(name="Bad_Name"), MODEL)
    assert any("DNS-1035" in e for e in d.errors(manifest))
    manifest = d.rayservice(_config(), MODEL) | {"kind": "RayCluster"}
    assert any("apiVersion/kind" in e for e in d.errors(manifest))


def test_gpu_worker_pods_each_hold_one_gpu_their_replica_reserves() -> None:
    manifest = d.rayservice(_config(gpu=True), MODEL)
    assert d.errors(manifest) == []
    cluster = manifest["spec"]["rayClusterConfig"]
    (workers,) = cluster["workerGroupSpecs"]
    pod = workers["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in head["containers"][0]["resources"]["limits"]
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["replica_gpus"] == 1.0
    assert d.GPU_BASE_IMAGE in d.dockerfile(_config(gpu=True))
    cpu = d.rayservice(_config(), MODEL)
    (app,) = yaml.safe_load(cpu["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["replica_gpus"] == 0.0
    assert (
        "tolerations"
        not in cpu["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    )


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"replicas": 4, "workers": 2}, "--replicas 4 on 2 worker pod(s)"),
        ({"max_workers": 1, "workers": 2}, "--max-workers 1 is below --workers 2"),
        ({"cpu": "0.5"}, "--cpu 0.5: each replica takes one CPU"),
        ({"cpu": "1500m"}, "--cpu 1500m"),
    ],
)
def test_a_rayservice_that_could_never_be_ready_is_refused(kw: dict, said: str) -> None:
    """A user's trial: each was written (exit 0), and the RayService would never place its
    replicas (one per pod; Ray counts a pod's CPUs from its limit, rounded down)."""
    with pytest.raises(d.DeployError, match=re.escape(said)):
        d.check_sizes(_config(**kw))
    d.check_sizes(_config(replicas=4, workers=2, max_workers=4, cpu="2"))  # room for all four


def test_the_image_builds_as_rays_user_with_cpu_torch_on_cpu() -> None:
    # A user's trial (2026-11-29): Ray's image runs as `ray` (uid 1000), and setuptools
    # failed in the root-owned source folder ("could not create 'build'"); and the CPU
    # image pulled PyPI's CUDA build of torch.
    lines = d.dockerfile(_config()).splitlines()
    copy = next(i for i, line in enumerate(lines) if "src/ /opt/pipeline/src/" in line)
    assert lines[copy].startswith("COPY --chown=ray:users src/ "), lines[copy]
    index = next(i for i, line in enumerate(lines) if '--index-url "$TORCH_INDEX"' in line)
    assert index < copy  # torch before the project, whose pins then keep it
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in lines
    pinned = {w.strip('"') for w in lines[index].split()}
    assert {"torch==2.14.1", "torchvision==0.29.1"} <= pinned  # pyproject.toml's pins
    gpu = d.dockerfile(_config(gpu=True))
    assert "COPY --chown=ray:users src/ " in gpu and "TORCH_INDEX" not in gpu


def test_the_dashboard_is_kept_to_the_operators_namespace_by_a_network_policy() -> None:
    # rayservice.yaml opens the head's dashboard (8265) on every interface, for KubeRay's
    # operator; Ray's Jobs API there runs any code sent to it, unauthenticated.
    from pipeline.runtimes.ray.netpolicy import network_policy

    config = _config(namespace="serving", operator_namespace="kuberay")
    manifest = d.rayservice(config, MODEL)
    cluster = manifest["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]
    (worker,) = [g["template"] for g in cluster["workerGroupSpecs"]]
    assert d.errors(manifest) == []  # the pods' labels are valid RayService fields
    policy = network_policy(config.name, config.namespace, config.operator_namespace, 8000)
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"] == {"name": "digits-lenet-head", "namespace": "serving"}
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    # It selects the head pod: its template's labels and KubeRay's node type, not a worker.
    selector = spec["podSelector"]["matchLabels"]
    on_head = head["metadata"]["labels"] | {"ray.io/node-type": "head"}
    on_worker = worker["metadata"]["labels"] | {"ray.io/node-type": "worker"}
    assert selector.items() <= on_head.items() and not selector.items() <= on_worker.items()
    rules = spec["ingress"]
    ports = [{p["port"] for p in r.get("ports", [])} for r in rules]
    # 8265 only from the operator's pods in its namespace (both in one peer: the namespace
    # alone let every pod there in); no rule opens it (or every port) to all.
    dashboard = [r for r, p in zip(rules, ports, strict=True) if 8265 in p]
    assert dashboard == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "kuberay"}
                    },
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
                }
            ],
            "ports": [{"protocol": "TCP", "port": 8265}],
        }
    ]
    for rule, open_ports in zip(rules, ports, strict=True):
        if "from" not in rule:
            assert open_ports == {8000}, rule  # Serve, behind the token
        elif not open_ports:  # every port: the RayService's own pods only
            (peer,) = rule["from"]
            own = peer["podSelector"]["matchLabels"]
            assert own.items() <= head["metadata"]["labels"].items()
            assert own.items() <= worker["metadata"]["labels"].items()
    assert {8000, 8265} <= set().union(*ports)
