"""`pipeline deploy kserve`: everything a user applies to a cluster, in one folder.

    <out>/Dockerfile                      the project's KServe runtime + the export
    <out>/kserve.json                     its RuntimeConfig (0.0.0.0, 8080 REST, 8081 gRPC)
    <out>/export/                         a copy of the export (sha256-checked first)
    <out>/src/                            the project's source the image installs
    <out>/inferenceservice.yaml           custom-container InferenceService (CPU)
    <out>/inferenceservice-gpu.yaml       the same with nvidia.com/gpu: 1
    <out>/torchserve/config/config.properties   KServe's TorchServe layout …
    <out>/torchserve/model-store/<name>.mar     … (copy both to the storageUri)
    <out>/torchserve/inferenceservice.yaml      model format pytorch, protocolVersion v2
    <out>/README.md                       the commands to build and apply

Every manifest is checked against KServe's CRD schema (strict about unknown
fields) and its webhook's rules before anything is written into <out>.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.core import signing
from pipeline.core.errors import PipelineError
from pipeline.core.fileio import readable_tree, staging_dir, sweep_abandoned
from pipeline.core.manifest import read_manifest
from pipeline.runtimes.kserve import leanimage
from pipeline.runtimes.kserve import manifests as m
from pipeline.runtimes.kserve.validate import check
from pipeline.serving import runtime, served
from pipeline.serving.capabilities import Packaging
from pipeline.serving.server import ServeError

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SOURCE_ITEMS = ("pyproject.toml", "README.md", "pipeline", "pipeline_runtime")
LAYOUT = "torchserve"  # KServe's TorchServe layout: copy its config/ and model-store/
STORE = f"{LAYOUT}/model-store"


class DeployError(PipelineError):
    """The deployment folder cannot be written from this export."""


@dataclass
class DeployResult:
    out: Path
    files: list[Path]
    mar: Path | None  # None: no registered runtime runs on KServe's `pytorch` format
    served_name: str  # /v2/models/<served_name> on the runtime image
    torchserve_name: str | None  # /v2/models/<torchserve_name> on TorchServe
    torch_free: bool = False  # the image leaves torch out (leanimage)


def _dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def deploy_kserve(config: m.DeployConfig, *, force: bool = False) -> DeployResult:
    from pipeline.formats import base as registry

    export_dir = Path(config.export_dir)
    signing.require(export_dir)  # a store's version: the trust policy, when there is one
    manifest = read_manifest(export_dir)  # raises a PipelineError when missing or unreadable
    if not config.format:  # what `pipeline serve` serves of this export, and why
        config.format, why = served.choose(manifest, served.fastest_entry(config.model, None))
        log.info("deploying %s as %s: %s", config.model, config.format, why)
    if manifest.model.name != config.model:
        raise DeployError(f"{export_dir} holds {manifest.model.name!r}, not {config.model!r}.")
    known = tuple(registry.keys())
    if config.format not in known:
        raise DeployError(f"Unknown format {config.format!r}; choose from {', '.join(known)}.")
    try:
        served.refuse_unserved(manifest, config.format)
    except ServeError as err:
        raise DeployError(str(err)) from None
    if config.format not in manifest.artifacts or config.format in manifest.failed:
        held = [k for k in manifest.artifacts if k in known]
        raise DeployError(
            f"{export_dir} has no {config.format} artifact; use --format with one it holds "
            f"({', '.join(held) or 'none'})."
        )
    for what, value in (
        ("--min-replicas", config.min_replicas),
        ("--max-replicas", config.max_replicas),
    ):
        if value < 0:
            raise DeployError(f"{what} must be 0 or more.")
    out = Path(config.out)
    if out.exists() and any(out.iterdir()) and not force:
        raise DeployError(f"{out} exists and is not empty; choose another --out or pass --force.")

    torch_free = leanimage.lean(config.format, manifest)  # as its worker will load it
    packager = _pytorch_runtime()
    docs = {
        "inferenceservice.yaml": m.runtime_isvc(config),
        "inferenceservice-gpu.yaml": m.runtime_isvc(config, gpu=True),
    }
    if packager is not None:
        docs[f"{LAYOUT}/inferenceservice.yaml"] = m.torchserve_isvc(config)
    for rel, doc in docs.items():
        check(doc, what=rel)  # before anything is written

    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_abandoned(out.parent)  # an earlier deploy's, killed mid-way
    staging = staging_dir(f".{out.name}.", out.parent)
    try:
        for rel, doc in docs.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_text(_dump(doc))
        (staging / "kserve.json").write_text(json.dumps(m.runtime_config(config), indent=2) + "\n")
        (staging / "Dockerfile").write_text(m.dockerfile(config, torch_free=torch_free))
        shutil.copytree(export_dir, staging / "export", ignore=_ignored)
        if not torch_free:  # torch's loaders open the export, eager model and all
            from pipeline.export.opened import carry_checkpoint

            carry_checkpoint(export_dir, manifest, staging / "export")
        _copy_source(staging / "src")
        for copied in ("export", "src"):  # COPY keeps modes; the image runs as uid 1000
            readable_tree(staging / copied)
        if torch_free:  # the torch-free image's one list (leanimage)
            (staging / "src" / leanimage.REQUIREMENTS_FILE).write_text(
                "\n".join(leanimage.requirements(PROJECT_ROOT / "pyproject.toml")) + "\n"
            )
        mar = ts_name = None
        if packager is not None:  # KServe's layout for its kserve-torchserve ServingRuntime
            mar = packager.package(config.model, export_dir, config.format, staging / STORE)
            ts_name = mar.stem
            beside = packager.layout_files(ts_name, envelope=config.torchserve_envelope)
            for rel, text in beside.items():
                (staging / LAYOUT / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / LAYOUT / rel).write_text(text)
        (staging / "README.md").write_text(_readme(config, ts_name))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files = sorted(
        p for p in out.rglob("*") if p.is_file() and "src" not in p.relative_to(out).parts[:1]
    )
    return DeployResult(
        out=out,
        files=files,
        mar=out / STORE / mar.name if mar else None,
        served_name=m.served_name(config.model),
        torchserve_name=ts_name,
        torch_free=torch_free,
    )


def _pytorch_runtime() -> Packaging | None:
    """The packaging of the registered runtime whose packages KServe's own `pytorch`
    ServingRuntime (kserve-torchserve) runs, asked of the registry so this package
    imports no other runtime; None when none is registered."""
    return next(
        (
            r.packaging
            for r in runtime.all_runtimes()
            if r.packaging and r.packaging.model_format == m.PYTORCH_FORMAT
        ),
        None,
    )


def _ignored(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n == "__pycache__" or n.endswith(".pyc") or n.startswith(".")}


def _copy_source(dest: Path) -> None:
    """The project's source, for the image to `pip install` (no network access to it)."""
    missing = [i for i in SOURCE_ITEMS if not (PROJECT_ROOT / i).exists()]
    if missing:
        raise DeployError(
            f"The project's source is not next to this installation ({PROJECT_ROOT} lacks "
            f"{', '.join(missing)}); run `pipeline deploy kserve` from a source checkout."
        )
    dest.mkdir(parents=True)
    for item in SOURCE_ITEMS:
        src = PROJECT_ROOT / item
        if src.is_dir():
            shutil.copytree(src, dest / item, ignore=_ignored)
        else:
            shutil.copy2(src, dest / item)


def _readme(config: m.DeployConfig, ts_name: str | None) -> str:
    name, served = config.name, m.served_name(config.model)
    ns = f" -n {config.namespace}" if config.namespace else ""  # it is not the current one
    own = f"""\
# Deploying {config.model} on KServe

Written by `pipeline deploy kserve`. Every manifest here was validated against the
InferenceService CRD schema of KServe v0.20.0 (strict about unknown fields).

## The project's runtime (custom container, Open Inference Protocol v2)

    docker build -t {config.image} .
    docker push {config.image}            # to a registry the cluster can pull from
    kubectl apply -f inferenceservice.yaml
    kubectl get inferenceservice{ns} {name}   # READY True
    # REST: POST http://<host>/v2/models/{served}/infer ; gRPC on port {m.GRPC_PORT}

GPU nodes: build `{config.gpu_image}` (see the Dockerfile's header) and apply
`inferenceservice-gpu.yaml` (requests nvidia.com/gpu: 1).
"""
    if ts_name is None:
        return own
    return (
        own
        + f"""
## TorchServe (KServe's `kserve-torchserve` runtime)

Copy `torchserve/config/` and `torchserve/model-store/` to the storage behind
`{config.storage_uri}` (so it holds config/config.properties and
model-store/{ts_name}.mar), then

    kubectl apply -f torchserve/inferenceservice.yaml
    kubectl get inferenceservice{ns} {name}-torchserve   # READY True
    # POST http://<host>/v2/models/{ts_name}/infer

The manifest pins the runtime image tag to {config.torchserve_image_tag} (`runtimeVersion`):
KServe's default torchserve-kfs 0.9.0 is older than the TorchServe that built the archive.
config.properties leaves TorchServe's kservev2 envelope off (and env config off, so
the runtime's TS_SERVICE_ENVELOPE cannot turn it on): the archive's handler reads
the Open Inference Protocol body itself and refuses what the envelope passes it.
"""
    )
