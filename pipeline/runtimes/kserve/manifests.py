"""The text of what `pipeline deploy kserve` writes: Dockerfile, InferenceServices,
TorchServe's config.properties. Pure functions of a DeployConfig; deploy.py writes
them and validate.py checks them.

Two ways to run an export on KServe:

* the project's own runtime (`python -m pipeline.runtimes.kserve.runtime`) in a container
  built from the Dockerfile, as a custom predictor container;
* TorchServe, through KServe's `kserve-torchserve` ServingRuntime (model format
  `pytorch`), reading KServe's layout: <storageUri>/config/config.properties and
  <storageUri>/model-store/<name>.mar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.runtimes.kserve.validate import API_VERSION, KIND

# Inside a pod the container must listen on 0.0.0.0: the kubelet's readiness probe
# and the Service/Knative queue-proxy reach it through the pod's own IP, not
# loopback, and the pod's network namespace is private to it, so "all interfaces"
# means the pod IP and nothing on the node. (127.0.0.1 would make every probe fail.)
POD_HOST = "0.0.0.0"
HTTP_PORT = 8080  # KServe's default container port for REST
GRPC_PORT = 8081  # and for gRPC
CONTAINER_NAME = "kserve-container"  # KServe expects the predictor's first container so named
SRV = "/srv"
EXPORT_IN_IMAGE = f"{SRV}/export"
CONFIG_IN_IMAGE = f"{SRV}/kserve.json"
# KServe's own default is pytorch/torchserve-kfs:0.9.0 (config/runtimes/kustomization.yaml,
# v0.20.0), built on a torch far older than the one the archives are made with; pin
# the image to the TorchServe release the archives were built and tested with.
DEFAULT_TORCHSERVE_IMAGE_TAG = "0.12.0"
# TorchServe >= 0.11 turns on token auth and turns off the model API by default; the
# KServe wrapper registers models through the (pod-local) management API, so both
# must be relaxed there (kserve docs/samples/v1beta1/torchserve/v2/mnist.yaml).
TORCHSERVE_ARGS = ("--disable-token-auth", "--enable-model-api")
PYTORCH_FORMAT = "pytorch"  # the modelFormat KServe's kserve-torchserve ServingRuntime runs


@dataclass
class DeployConfig:
    model: str
    export_dir: Path
    out: Path
    format: str = "torchscript"
    name: str = ""  # InferenceService name; default: from the model
    namespace: str | None = None
    image: str = ""  # the runtime image built from the Dockerfile; default pipeline-<name>:latest
    gpu_image: str = ""  # default: <image>-gpu
    cpu_request: str = "1"
    cpu_limit: str = "2"
    memory_request: str = "2Gi"
    memory_limit: str = "4Gi"
    min_replicas: int = 1
    max_replicas: int = 3
    scale_metric: str = "cpu"  # HPA (Standard mode): cpu or memory
    scale_target: int = 70  # percent utilisation for cpu
    storage_uri: str = (
        ""  # TorchServe layout's location in the cluster; default pvc://models/<name>
    )
    torchserve_image_tag: str = DEFAULT_TORCHSERVE_IMAGE_TAG
    torchserve_envelope: bool = False  # see pipeline.runtimes.torchserve.properties.on_kserve
    threads: int = 1
    max_batch_size: int = 8
    extra_labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.name or isvc_name(self.model)
        self.image = self.image or f"pipeline-{self.name}:latest"
        self.gpu_image = self.gpu_image or _tag_suffix(self.image, "-gpu")
        self.storage_uri = self.storage_uri or f"pvc://models/{self.name}"
        if "://" not in self.storage_uri:  # KServe's storage initializer needs a scheme
            raise PipelineError(
                f"--storage-uri {self.storage_uri!r} is no URI: give one KServe's storage "
                "initializer reads, e.g. pvc://models/NAME, s3://bucket/path or gs://bucket/path."
            )


def isvc_name(model: str) -> str:
    """'torchvision:resnet18' → 'torchvision-resnet18' (DNS-1035: KServe's name rule)."""
    from pipeline.core.paths import model_slug

    name = re.sub(r"[^a-z0-9-]+", "-", model_slug(model).lower()).strip("-")
    name = re.sub(r"^[^a-z]+", "", name)[:63].rstrip("-")
    return name or "model"


def served_name(model: str) -> str:
    """The Open Inference Protocol model name the runtime serves (/v2/models/<name>)."""
    from pipeline.core.paths import model_slug

    return model_slug(model)


def _tag_suffix(image: str, suffix: str) -> str:
    repo, sep, tag = image.rpartition(":")
    if sep and "/" not in tag:
        return f"{repo}:{tag}{suffix}"
    return f"{image}:latest{suffix}"


def _metadata(config: DeployConfig, name: str, extra_annotations: dict[str, str]) -> dict:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": "pipeline", **config.extra_labels},
        "annotations": {
            # Set explicitly: KServe's webhook branches on the raw annotation.
            "serving.kserve.io/deploymentMode": "Standard",
            "serving.kserve.io/autoscalerClass": "hpa",
            **extra_annotations,
        },
    }
    if config.namespace:
        meta["namespace"] = config.namespace
    return meta


def _scaling(config: DeployConfig) -> dict[str, Any]:
    return {
        "minReplicas": config.min_replicas,
        "maxReplicas": config.max_replicas,
        "scaleMetric": config.scale_metric,
        "scaleTarget": config.scale_target,
    }


def _resources(config: DeployConfig, gpu: bool) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": config.cpu_request, "memory": config.memory_request}
    limits: dict[str, str] = {"cpu": config.cpu_limit, "memory": config.memory_limit}
    if gpu:
        # An extended resource: requests must equal limits (or be left out).
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = "1"
    return {"requests": requests, "limits": limits}


def runtime_isvc(config: DeployConfig, *, gpu: bool = False) -> dict[str, Any]:
    """An InferenceService running the project's runtime image as a custom container.

    `protocolVersion` exists only on `model` (and the legacy framework specs) in the
    CRD, not on a container, so a custom container says v2 through env PROTOCOL."""
    probe = {"httpGet": {"path": "/v2/health/ready", "port": HTTP_PORT}}
    container = {
        "name": CONTAINER_NAME,
        "image": config.gpu_image if gpu else config.image,
        "env": [{"name": "PROTOCOL", "value": "v2"}],
        "ports": [
            {"name": "http1", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            **probe,
            "initialDelaySeconds": 5,
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": HTTP_PORT},
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": _resources(config, gpu),
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    predictor: dict[str, Any] = {**_scaling(config), "containers": [container]}
    if gpu:
        predictor["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata(config, config.name + ("-gpu" if gpu else ""), {}),
        "spec": {"predictor": predictor},
    }


def runtime_config(config: DeployConfig) -> dict[str, Any]:
    """The pipeline.runtimes.kserve.config.RuntimeConfig the container starts from, as JSON."""
    from dataclasses import asdict

    from pipeline.runtimes.kserve.config import RuntimeConfig, ServedExport

    rc = RuntimeConfig(
        models=[ServedExport(served_name(config.model), EXPORT_IN_IMAGE, config.format)],
        host=POD_HOST,  # see POD_HOST: loopback would be unreachable from the kubelet
        http_port=HTTP_PORT,
        grpc_port=GRPC_PORT,
        # No per-request token inside the cluster: authentication belongs to the
        # ingress / service mesh in front of KServe, as for KServe's own runtimes.
        token_file="",
        max_batch_size=config.max_batch_size,
        threads=config.threads,
    )
    return asdict(rc)


# The lean image's GPU build: onnxruntime-gpu 1.31 is a CUDA 13 build; its extras bring
# the CUDA runtime and cuDNN as NVIDIA's wheels (ortsession preloads them, torch-free).
ORT_GPU_PACKAGE = "onnxruntime-gpu[cuda,cudnn]"

# Both images, from the export on: the export, the config, an unprivileged user, the runtime.
_IMAGE_TAIL = f"""\
COPY export/ {EXPORT_IN_IMAGE}/
# {CONFIG_IN_IMAGE} binds {POD_HOST}: inside a pod the kubelet's probes and the Service
# reach the container through the pod IP, never loopback; the pod's network
# namespace is its own, so this exposes nothing on the node.
COPY kserve.json {CONFIG_IN_IMAGE}
USER 1000
EXPOSE {HTTP_PORT} {GRPC_PORT}
CMD ["python", "-m", "pipeline.runtimes.kserve.runtime", "{CONFIG_IN_IMAGE}"]
"""


def dockerfile(config: DeployConfig, *, torch_free: bool = False) -> str:
    """The image's Dockerfile; `torch_free`: the lean one (leanimage.lean said so)."""
    from pipeline.runtimes.kserve import leanimage

    if torch_free:
        return _lean_dockerfile(config, leanimage.REQUIREMENTS_FILE, leanimage.EXTRA)
    return (
        f"""\
# syntax=docker/dockerfile:1
# Written by `pipeline deploy kserve --model {config.model}`. Build from this folder:
#   docker build -t {config.image} .
#   docker build -t {config.gpu_image} --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
# The image runs the project's KServe runtime (Open Inference Protocol v2, REST on
# {HTTP_PORT}, gRPC on {GRPC_PORT}) over the export copied into {EXPORT_IN_IMAGE}.
FROM python:3.11-slim
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY src/ /opt/pipeline/
RUN pip install --extra-index-url "$TORCH_INDEX" /opt/pipeline \\
    && useradd --uid 1000 --no-create-home --shell /usr/sbin/nologin serve
"""
        + _IMAGE_TAIL
    )


def _lean_dockerfile(config: DeployConfig, requirements: str, extra: str) -> str:
    return (
        f"""\
# syntax=docker/dockerfile:1
# Written by `pipeline deploy kserve --model {config.model} --format {config.format}`:
#   docker build -t {config.image} .
#   docker build -t {config.gpu_image} --build-arg "ORT_PACKAGE={ORT_GPU_PACKAGE}" .
# The image runs the project's KServe runtime (Open Inference Protocol v2, REST on
# {HTTP_PORT}, gRPC on {GRPC_PORT}) over the export copied into {EXPORT_IN_IMAGE}.
# Torch-free: ONNX Runtime serves {config.format}, so the project is installed without
# its dependencies and then only its `{extra}` extra ({requirements}). The GPU build
# takes ONNX Runtime's CUDA package (same version) with NVIDIA's CUDA and cuDNN wheels.
FROM python:3.11-slim
ARG ORT_PACKAGE=onnxruntime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY src/ /opt/pipeline/
RUN sed -i "s/^onnxruntime==/${{ORT_PACKAGE}}==/" /opt/pipeline/{requirements} \\
    && pip install --no-deps /opt/pipeline \\
    && pip install -r /opt/pipeline/{requirements} \\
    && useradd --uid 1000 --no-create-home --shell /usr/sbin/nologin serve
"""
        + _IMAGE_TAIL
    )


def torchserve_isvc(config: DeployConfig) -> dict[str, Any]:
    """An InferenceService for KServe's TorchServe runtime over the layout at storageUri."""
    model = {
        "modelFormat": {"name": PYTORCH_FORMAT},
        "protocolVersion": "v2",
        "storageUri": config.storage_uri,
        "runtimeVersion": config.torchserve_image_tag,
        "args": list(TORCHSERVE_ARGS),
        "resources": _resources(config, gpu=False),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata(config, f"{config.name}-torchserve", {}),
        "spec": {"predictor": {**_scaling(config), "model": model}},
    }
