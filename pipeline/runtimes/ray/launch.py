"""Start the Ray runtime for `pipeline serve --runtime ray` (and a private one for loadtest
and bench).

`start` writes `<run_dir>/ray.json`, the inference token (`inference_key.json`, the
shape every runtime's clients read), starts `python -m pipeline.runtimes.ray.host
<run_dir>/ray.json` in its own session with Ray's environment (constants.RAY_ENV),
waits until the host has deployed the application and `/v2/health/ready` answers, and
records `server.json`, which `pipeline stop` reads. Nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipeline.core import fileio, signing
from pipeline.core import paths as core_paths
from pipeline.core.manifest import read_manifest
from pipeline.formats import base as registry
from pipeline.runtimes.ray.constants import (
    CONFIG_FILE,
    NAME,
    RAY_ENV,
    READY_FILE,
    STATE_FILE,
    TITLE,
)
from pipeline.serving import launcher, served, versions
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.server import INFERENCE_KEY_FILE, ServeError, Server
from pipeline_runtime import formats
from pipeline_runtime.manifest import Manifest


@dataclass
class RayConfig:
    """What the host process reads (ray.json)."""

    models: list[dict[str, Any]]  # name, export_dir, format, version, platform
    host: str = "127.0.0.1"
    port: int = 8000
    max_request_size: int = 4 * 1024 * 1024
    token_file: str = ""
    address: str | None = None  # an existing cluster's; None: start a local one
    worker_nodes: int = 0  # worker nodes of the local cluster (0: the head alone)
    node_cpus: int = 1  # CPUs each local node offers (the head's without worker nodes)
    replicas: int = 1
    autoscaling: dict[str, Any] = field(default_factory=dict)  # Serve's autoscaling_config
    max_replicas_per_node: int | None = None
    replica_cpus: float = 1.0
    threads: int = 1  # intra-op threads of each replica
    max_batch_size: int = 8
    batch_wait_ms: float = 0.0
    object_store_mb: int = 100
    replica_cpus_asked: float | None = None  # --ray-replica-cpus; None: replica_cpus()
    # GPUs each replica reserves (--ray-replica-gpus): Ray gives it those devices and it runs
    # on them; 0 runs on CPU (Ray 2.60 leaves CUDA visible to an actor without GPUs).
    replica_gpus: float = 0.0
    # The public keys --trust gave `serve` (start fills them in): each replica checks a
    # store version against them and the store's trust folder as it loads it, on any node.
    trust: list[str] = field(default_factory=list)
    # The keys each store's policy held as `serve` started (signing.pins): the replicas
    # trust at most those, wherever and whenever they are placed.
    pins: dict[str, list[str]] = field(default_factory=dict)


def served_model(
    export_dir: Path, fmt: str | None, manifest: Manifest | None = None
) -> tuple[dict[str, Any], ServedInfo]:
    """One export as a served model (its folder's model name, the format `pipeline serve`
    would pick unless `fmt` names one) and what the record says it holds. `manifest`: the
    export's, when the caller has read it."""
    export_dir = Path(export_dir).resolve()
    manifest = manifest or read_manifest(export_dir)
    fmt = fmt or served.export_format(manifest)
    served.refuse_unserved(manifest, fmt)
    if fmt not in manifest.artifacts or fmt in manifest.unwritten:
        held = [k for k in manifest.artifacts if k in registry.served_keys()]
        raise ServeError(
            f"{export_dir} has no {fmt!r} artifact; serve one it holds "
            f"({', '.join(held) or 'none'}) with --ray-format (`deploy ray`: --format)."
        )
    why = served.why_served(manifest, fmt, served.fastest_entry(manifest.model.name, None))
    platform = formats.of(fmt, manifest.artifact(fmt).details).platform
    model = {
        "name": core_paths.model_slug(manifest.model.name),
        "export_dir": str(export_dir),
        "format": fmt,
        "version": versions.number_of(export_dir),
        "platform": platform,
    }
    return model, ServedInfo.of(manifest, fmt, why=why)


def start(
    config: RayConfig, run_dir: Path, infos: dict[str, ServedInfo], timeout_s: float = 240.0
) -> Server:
    """Start the host process; return once every model answers ready."""
    names = [m["name"] for m in config.models]
    if not names:
        raise ServeError("Nothing to serve: give at least one export.")
    if len(set(names)) != len(names):
        raise ServeError(f"Two served models share a name: {names}.")
    if config.address:
        _reachable(config.address)
    run_dir = launcher.prepare(
        launcher.Launch(
            title=TITLE,
            run_dir=run_dir,
            host=config.host,
            ports=[(config.host, config.port, "--port")],
        )
    )
    token = run_dir / INFERENCE_KEY_FILE
    if not token.is_file():
        fileio.write_secret(token, {"inference": {"key": secrets.token_urlsafe(24)}})
    config.token_file = str(token)
    config.trust = config.trust or signing.given_keys()
    config.pins = signing.pins([Path(m["export_dir"]) for m in config.models], config.trust)
    config.replica_cpus = replica_cpus(config)
    (run_dir / READY_FILE).unlink(missing_ok=True)
    conf = run_dir / CONFIG_FILE
    conf.write_text(json.dumps(asdict(config), indent=1))
    threads = str(max(1, config.threads))
    env = {
        **os.environ,
        **RAY_ENV,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    argv = [sys.executable, "-m", "pipeline.runtimes.ray.host", str(conf)]
    proc = launcher.spawn(argv, run_dir, "ray.out", env)
    url = f"http://{config.host}:{config.port}"
    server = Server(
        runtime=NAME,
        pid=proc.pid,
        run_dir=str(run_dir),
        inference_url=url,
        metrics_url=url,
        models=names,
        started=launcher.created(proc.pid),
        markers=[CONFIG_FILE],
        served=infos,
        trust=list(config.trust),
        pins=config.pins,
        extras={"cluster": config.address or _local(config)},
    )
    server.record()

    def ready() -> bool:
        if not (run_dir / READY_FILE).is_file():
            return False
        try:
            return httpx.get(f"{_url(run_dir, url)}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    with launcher.stopped_on_failure(run_dir):
        launcher.wait_until(ready, proc, run_dir / "logs" / "ray.out", timeout_s, "The Ray runtime")
        served_at = _url(run_dir, url)
        extras = {**server.extras, "ray_logs": _state(run_dir).get("ray_logs")}
        # A joined cluster's proxy serves this run under its own path; "asked" only when the
        # proxy is another one (Serve already ran there), not for the path alone.
        if elsewhere(served_at, url):
            extras["asked"] = url
        server = dataclasses.replace(
            server, inference_url=served_at, metrics_url=served_at, extras=extras
        )
        server.record()
    return server


def elsewhere(served_at: str, asked: str) -> bool:
    """Whether a run answers on another proxy than the one it asked for (`--port`): not
    when only this run's path on the proxy differs (a joined cluster's Serve it started)."""

    def where(url: str) -> tuple[str, int | None]:
        parts = urlsplit(url)  # a wildcard --host is answered on loopback (the host's url)
        host = "127.0.0.1" if parts.hostname in ("0.0.0.0", "::") else parts.hostname
        return str(host), parts.port

    return where(served_at) != where(asked)


def _state(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def _url(run_dir: Path, default: str) -> str:
    """Where the host says Serve's proxy listens (ray_state.json), else `default`."""
    return str(_state(run_dir).get("url") or default)


def replica_cpus(config: RayConfig) -> float:
    """The CPUs each replica reserves: one, unless the local cluster's CPUs for replicas
    (the worker nodes', else the head's) are fewer than the replicas asked for; then an
    even share, so that every replica is placed (bench serves three formats side by side
    on a one-node cluster). On a joined cluster: one, its own capacity decides.
    --ray-replica-cpus says otherwise (0: no CPU reserved, placed wherever Ray likes)."""
    if config.replica_cpus_asked is not None:
        return config.replica_cpus_asked
    if config.address:
        return 1.0
    per_model = max(config.replicas, int(config.autoscaling.get("max_replicas", 0)))
    wanted = len(config.models) * max(1, per_model)
    cpus = config.node_cpus * (config.worker_nodes or 1)
    return min(1.0, cpus / wanted)


def _reachable(address: str) -> None:
    """A cluster address that answers nothing is said at once: ray.init retried it for the
    whole start's timeout (4 minutes of silence, then its GCS logs)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit():  # "auto", or a form Ray resolves itself
        return
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5):
            pass
    except OSError as err:
        raise ServeError(
            f"Cannot reach the Ray cluster at {address} ({err.strerror or err}): start one "
            "there (`ray start --head`) or give the address it printed with --ray-address."
        ) from None


def _local(config: RayConfig) -> str:
    if not config.worker_nodes:
        return f"a local one-node cluster ({config.node_cpus} CPU(s)) on 127.0.0.1"
    return (
        f"a local cluster on 127.0.0.1: a head and {config.worker_nodes} worker node(s) of "
        f"{config.node_cpus} CPU(s)"
    )


@contextlib.contextmanager
def private(
    models: list[tuple[Path, str]],
    names: list[str] | None = None,
    manifest: Manifest | None = None,
    **settings: Any,
) -> Iterator[Server]:
    """A runtime of its own serving each (export folder, format), on a free loopback port
    from a temporary run folder, stopped on exit. `names`: the served names (default:
    the models' own); `manifest`: the exports' (one export, several formats: bench);
    `settings`: RayConfig's."""
    with tempfile.TemporaryDirectory(prefix="ray-") as tmp:
        served_models, infos = [], {}
        for i, (export_dir, fmt) in enumerate(models):
            model, info = served_model(export_dir, fmt, manifest)
            if names:
                model["name"] = names[i]
            served_models.append(model)
            infos[model["name"]] = info
        config = RayConfig(models=served_models, port=launcher.free_port(), **settings)
        run_dir = Path(tmp) / "run"
        server = start(config, run_dir, infos)
        try:
            yield server
        finally:
            launcher.stop(run_dir)
