"""`pipeline deploy ray`: a KubeRay RayService for one export, in one folder.

    <out>/Dockerfile          Ray's image + the project + the export (/opt/pipeline/export)
    <out>/export/             a copy of the export
    <out>/src/                the project's source the image installs
    <out>/serve_config.yaml   the Serve application (also inside the RayService)
    <out>/rayservice.yaml     the RayService: its Serve config and its Ray cluster
    <out>/networkpolicy.yaml  the head pod's dashboard (8265) to KubeRay's operator only
    <out>/README.md           the commands to build, create the token and apply

The application is the one `pipeline serve --runtime ray` runs (app.app_builder reads
the same settings from the Serve config's `args`): the OIP ingress and one deployment
per model. The token comes from a Kubernetes Secret mounted in every Ray pod, since the
ingress may be placed on any of them. The RayService is checked against KubeRay's CRD
schema (vendored, strict about unknown fields) before anything is written.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.core import signing
from pipeline.core.errors import PipelineError
from pipeline.core.fileio import readable_tree
from pipeline.core.manifest import read_manifest
from pipeline.runtimes.ray.launch import RayConfig, served_model
from pipeline.runtimes.ray.netpolicy import DASHBOARD_PORT, network_policy, pod_labels
from pipeline.serving import crd

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SOURCE_ITEMS = ("pyproject.toml", "README.md", "pipeline", "pipeline_runtime")
RAY_VERSION = "2.60.0"
BASE_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311-cpu"
# Ray's CUDA image: the driver comes from the node; torch's wheel brings its CUDA libraries.
GPU_BASE_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311-gpu"
EXPORT_IN_IMAGE = "/opt/pipeline/export"
TOKEN_DIR = "/var/run/pipeline"
SERVE_PORT = 8000
SCHEMA_FILE = "rayservice-v1.json.gz"
API_VERSION, KIND = "ray.io/v1", "RayService"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class DeployError(PipelineError):
    """The deployment folder cannot be written, or the manifest would be refused."""


@dataclass
class RayDeployConfig:
    model: str
    export_dir: Path
    out: Path
    format: str | None = None  # None: the one `pipeline serve` would serve
    name: str = ""  # the RayService's; default from the model (digits-lenet)
    namespace: str | None = None
    image: str = ""  # default pipeline-ray-<name>:latest
    workers: int = 2  # worker pods (min = max unless autoscaling)
    max_workers: int = 0  # > workers: KubeRay's autoscaler may add pods up to this
    replicas: int = 2  # Serve replicas of the model
    cpu: str = "1"  # each worker pod's CPU request = limit
    memory: str = "2Gi"
    max_request_size: int = 4 * 1024 * 1024
    gpu: bool = False  # one GPU per worker pod, which its replica reserves and runs on
    # Where KubeRay's operator runs: the only namespace networkpolicy.yaml lets reach the
    # dashboard (Helm installs it in the current namespace, by default `default`).
    operator_namespace: str = "default"


def service_name(model: str) -> str:
    """A DNS-1035 label from the model's name: digits_lenet → digits-lenet."""
    name = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")
    name = name if name[:1].isalpha() else f"m-{name}"
    return name[:50].rstrip("-")


def serve_config(config: RayDeployConfig, model: dict[str, Any]) -> dict[str, Any]:
    """Serve's config file: HTTP on every interface of the head pod, one application."""
    settings = RayConfig(
        models=[{**model, "export_dir": EXPORT_IN_IMAGE}],
        host="0.0.0.0",
        port=SERVE_PORT,
        max_request_size=config.max_request_size,
        token_file=f"{TOKEN_DIR}/inference_key.json",
        replicas=config.replicas,
        max_replicas_per_node=1,  # one replica per worker pod: a pod's loss takes one
        replica_gpus=1.0 if config.gpu else 0.0,
    )
    return {
        "http_options": {"host": "0.0.0.0", "port": SERVE_PORT},
        "applications": [
            {
                "name": config.name,
                "route_prefix": "/",
                "import_path": "pipeline.runtimes.ray.app:app_builder",
                "args": asdict(settings),
            }
        ],
    }


def _container(name: str, config: RayDeployConfig, head: bool) -> dict[str, Any]:
    resources = {"cpu": config.cpu, "memory": config.memory}
    if config.gpu and not head:  # KubeRay gives the node num-gpus from this limit
        resources["nvidia.com/gpu"] = "1"
    container: dict[str, Any] = {
        "name": name,
        "image": config.image,
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [{"name": "inference-key", "mountPath": TOKEN_DIR, "readOnly": True}],
    }
    if head:
        container["ports"] = [
            {"containerPort": 6379, "name": "gcs-server"},
            # KubeRay's operator needs it; networkpolicy.yaml keeps everyone else out.
            {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
            {"containerPort": SERVE_PORT, "name": "serve"},
        ]
    return container


def _pod(name: str, config: RayDeployConfig, head: bool) -> dict[str, Any]:
    secret = {"secretName": f"{config.name}-inference-key"}
    spec: dict[str, Any] = {
        "containers": [_container(name, config, head)],
        "volumes": [{"name": "inference-key", "secret": secret}],
    }
    if config.gpu and not head:  # GPU nodes are commonly tainted for GPU workloads only
        spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    # The labels networkpolicy.yaml selects the RayService's pods by.
    return {"metadata": {"labels": pod_labels(config.name)}, "spec": spec}


def rayservice(config: RayDeployConfig, model: dict[str, Any]) -> dict[str, Any]:
    serve = serve_config(config, model)
    workers = {
        "groupName": "gpu" if config.gpu else "cpu",
        "replicas": config.workers,
        "minReplicas": config.workers,
        "maxReplicas": max(config.workers, config.max_workers),
        "rayStartParams": {},
        "template": _pod("ray-worker", config, head=False),
    }
    metadata: dict[str, Any] = {"name": config.name}
    if config.namespace:
        metadata["namespace"] = config.namespace
    cluster: dict[str, Any] = {
        "rayVersion": RAY_VERSION,
        # The head runs the GCS, Serve's controller and proxy, not replicas (num-cpus 0).
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            "template": _pod("ray-head", config, head=True),
        },
        "workerGroupSpecs": [workers],
    }
    if config.max_workers > config.workers:
        cluster["enableInTreeAutoscaling"] = True
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve, sort_keys=False),
            "rayClusterConfig": cluster,
        },
    }


def errors(manifest: dict[str, Any]) -> list[str]:
    """Every way `manifest` breaks KubeRay's RayService schema or naming."""
    found = crd.schema_errors(manifest, "pipeline.runtimes.ray", SCHEMA_FILE)
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        found.append(f"apiVersion/kind must be {API_VERSION} / {KIND}")
    name = (manifest.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > 63:
        found.append(f"metadata/name: {name!r} must be a DNS-1035 label (at most 63 characters)")
    return found + crd.pod_errors(manifest)


def check_sizes(config: RayDeployConfig) -> None:
    """Pods, replicas and CPUs that a RayService could run; DeployError says what not."""
    if config.workers < 1 or config.replicas < 1:
        raise DeployError("--workers and --replicas must be at least 1.")
    most = max(config.workers, config.max_workers)
    if config.replicas > most:  # one replica per worker pod: the rest could never be placed
        raise DeployError(
            f"--replicas {config.replicas} on {most} worker pod(s): each pod holds one "
            f"replica, so the RayService would never be ready; give --workers {config.replicas} "
            "or fewer replicas."
        )
    if config.max_workers and config.max_workers < config.workers:
        raise DeployError(
            f"--max-workers {config.max_workers} is below --workers {config.workers}: give "
            "at least as many (it lets KubeRay's autoscaler add pods up to that number)."
        )
    try:  # Ray counts a pod's CPUs from its limit, rounded down: under 1, no replica fits
        whole = float(config.cpu.removesuffix("m")) / (1000 if config.cpu.endswith("m") else 1)
    except ValueError:
        whole = None  # the schema check below names a quantity it cannot read
    if whole is not None and (whole < 1 or whole != int(whole)):
        raise DeployError(
            f"--cpu {config.cpu}: each replica takes one CPU of its pod, and Ray counts a "
            "pod's CPUs from its limit rounded down; give a whole number of at least 1."
        )


def check(manifest: dict[str, Any], what: str = "rayservice.yaml") -> None:
    found = errors(manifest)
    if found:
        raise DeployError(f"{what} is not a valid KubeRay {KIND}:\n  {crd.listed(found)}")


# PyPI's torch wheel for x86_64 is the CUDA build (GBs of CUDA libraries): a CPU image
# takes torch and torchvision from PyTorch's CPU index first, as the KServe image does.
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# Ray's images run as user `ray` (uid 1000, group users): a root-owned source folder
# fails setuptools' build there ("could not create 'build': Permission denied").
IMAGE_USER = "ray:users"


def torch_pins() -> list[str]:
    """The project's torch and torchvision requirements (pyproject.toml's pins, so the
    project's install keeps the CPU wheels); unpinned when pyproject.toml is not there."""
    import tomllib

    try:
        deps = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    except (OSError, ValueError, KeyError):
        return ["torch", "torchvision"]
    pins = {re.split(r"[=<>!~; ]", d, maxsplit=1)[0]: d for d in deps["dependencies"]}
    return [pins.get(name, name) for name in ("torch", "torchvision")]


def dockerfile(config: RayDeployConfig) -> str:
    kind = "with CUDA, for GPU pods" if config.gpu else "CPU"
    torch = " ".join(f'"{p}"' for p in torch_pins())
    # The GPU image keeps PyPI's wheel: its CUDA build is the one it needs.
    cpu_torch = (
        ""
        if config.gpu
        else f"""ARG TORCH_INDEX={TORCH_INDEX}
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" {torch}
"""
    )
    return f"""\
# The Ray runtime's image for KubeRay: Ray {RAY_VERSION} (Python 3.11, {kind}), the project
# and the export. Build: docker build -t {config.image} .
FROM {GPU_BASE_IMAGE if config.gpu else BASE_IMAGE}
{cpu_torch}COPY --chown={IMAGE_USER} src/ /opt/pipeline/src/
RUN pip install --no-cache-dir "/opt/pipeline/src[ray]"
COPY export/ {EXPORT_IN_IMAGE}/
"""


def readme(config: RayDeployConfig) -> str:
    gpus = ", each pod with one GPU (`nvidia.com/gpu: 1`) its replica runs on" if config.gpu else ""
    return f"""\
# {config.name} on KubeRay

1. Build and push the image: `docker build -t {config.image} . && docker push {config.image}`
2. Create the inference token (clients send `Authorization: Bearer <key>`):
   `kubectl create secret generic {config.name}-inference-key --from-file=inference_key.json`
   with `{{"inference": {{"key": "<a long random string>"}}}}` in inference_key.json.
3. Apply: `kubectl apply -f rayservice.yaml -f networkpolicy.yaml` (KubeRay's operator
   must be installed). The head's dashboard (8265) must stay reachable by the operator,
   and its Jobs API runs any code it is sent, without authentication: networkpolicy.yaml
   lets only the namespace `{config.operator_namespace}` (the operator's; change it if
   yours runs elsewhere) reach it, where the network plugin enforces NetworkPolicy.
4. Ask: `kubectl port-forward svc/{config.name}-serve-svc {SERVE_PORT}` and
   `curl -H "Authorization: Bearer <key>" localhost:{SERVE_PORT}/v2/models/<model>`.

The Open Inference Protocol over REST; `pipeline verify --backend ray` and tritonclient
speak to it as to `pipeline serve --runtime ray`. {config.replicas} replica(s) on
{config.workers} worker pod(s), one replica per pod{gpus}.
"""


def deploy_ray(config: RayDeployConfig, *, force: bool = False) -> list[Path]:
    """Write the folder; return the files written (outside export/)."""
    export_dir = Path(config.export_dir)
    signing.require(export_dir)  # a store's version: the trust policy, when there is one
    manifest_read = read_manifest(export_dir)
    model, _ = served_model(export_dir, config.format, manifest_read)
    config.name = config.name or service_name(config.model)
    config.image = config.image or f"pipeline-ray-{config.name}:latest"
    check_sizes(config)
    manifest = rayservice(config, model)
    check(manifest)
    out = Path(config.out)
    if out.exists() and any(out.iterdir()) and not force:
        raise DeployError(f"{out} is not empty; pass --force to replace it.")
    missing = [i for i in SOURCE_ITEMS if not (PROJECT_ROOT / i).exists()]
    if missing:
        raise DeployError(
            f"The project's source is not next to this installation ({PROJECT_ROOT} lacks "
            f"{', '.join(missing)}); run `pipeline deploy ray` from a source checkout."
        )
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
        staging = Path(tmp) / "out"
        staging.mkdir()
        shutil.copytree(export_dir, staging / "export", ignore=skip)
        # Replicas open a TorchScript or .pt2 export with its eager model (and the shadow
        # check needs it for every format): the folder carries the checkpoint.
        from pipeline.export.opened import carry_checkpoint

        carry_checkpoint(export_dir, manifest_read, staging / "export")
        readable_tree(staging / "export")  # COPY keeps modes; the image runs as another user
        for item in SOURCE_ITEMS:
            src, dest = PROJECT_ROOT / item, staging / "src" / item
            dest.parent.mkdir(exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dest, ignore=skip)
            else:
                shutil.copy2(src, dest)
        files = {
            "Dockerfile": dockerfile(config),
            "serve_config.yaml": yaml.safe_dump(serve_config(config, model), sort_keys=False),
            "rayservice.yaml": yaml.safe_dump(manifest, sort_keys=False),
            "networkpolicy.yaml": yaml.safe_dump(
                network_policy(
                    config.name, config.namespace, config.operator_namespace, SERVE_PORT
                ),
                sort_keys=False,
            ),
            "README.md": readme(config),
        }
        for name, text in files.items():
            (staging / name).write_text(text)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), out)
    return [out / name for name in files]
