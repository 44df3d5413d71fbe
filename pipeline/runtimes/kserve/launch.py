"""Start and stop the KServe runtime for `pipeline serve --runtime kserve`.

`start` writes the runtime's config to `<run_dir>/kserve.json`, keeps the inference
token in `<run_dir>/inference_key.json` from the previous start when it is fit, else
writes a new one (mode 0600, the shape TorchServe's clients read:
`{"inference": {"key": ...}}`; `rotate_token` always writes one; see tokens.py), off
loopback does the same for the metrics key in `metrics_key.json`, starts
`python -m pipeline.runtimes.kserve.supervisor <run_dir>/kserve.json` in its own session
(it starts `config.workers` runtime processes sharing the ports; supervisor.py),
waits until `/v2/health/ready` answers 200 (every worker's models loaded and warmed up)
and records a `server.json` that `pipeline stop` (`pipeline.serving.launcher.stop`)
recognises and stops.

Nothing here imports kserve (it parses sys.argv on import).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from pipeline.core import signing
from pipeline.core.manifest import read_manifest
from pipeline.runtimes.kserve.config import CONFIG_FILE, RuntimeConfig, ServedExport
from pipeline.runtimes.kserve.constants import METRICS_KEY_FILE, NAME
from pipeline.runtimes.kserve.manifests import served_name
from pipeline.runtimes.kserve.security import is_loopback
from pipeline.runtimes.kserve.tokens import INFERENCE, METRICS, KeyState, ensure_key
from pipeline.serving import live, served, versions
from pipeline.serving.launcher import (
    Launch,
    created,
    free_port,
    prepare,
    spawn,
    stop,
    stopped_on_failure,
    wait_until,
)
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.server import (
    INFERENCE_KEY_FILE,
    ServeError,
    Server,
)
from pipeline_runtime.manifest import Manifest

log = logging.getLogger(__name__)

__all__ = ["private", "served_export", "start", "stop", "write_tokens"]


def served_export(
    export_dir: Path,
    fmt: str | None = None,
    name: str | None = None,
    manifest: Manifest | None = None,
) -> ServedExport:
    """The export at `export_dir` as one served model: format `fmt` (default: the one
    `pipeline serve` would serve, `served.export_format`) under `name` (default: the model's
    folder name, `manifests.served_name`: digits_lenet, torchvision_resnet18, my_model_MyModel for
    models/my_model.py:MyModel, as `pipeline archive` and `deploy kserve` name it).
    `manifest`: its manifest, when the caller has read it."""
    export_dir = Path(export_dir).resolve()
    manifest = manifest or read_manifest(export_dir)
    held = served.servable(manifest)
    if fmt is None:
        if not held:
            raise ServeError(f"{export_dir} holds no artifact to serve; re-run `pipeline export`.")
        fmt = served.export_format(manifest)
    elif fmt not in held:
        served.refuse_unserved(manifest, fmt)
        raise ServeError(
            f"{export_dir} has no {fmt!r} artifact; it holds {', '.join(held) or 'none'}."
        )
    name = name or served_name(manifest.model.name)
    why = served.why_served(manifest, fmt, served.fastest_entry(manifest.model.name, None))
    info = ServedInfo.of(manifest, fmt, why=why)
    version = versions.number_of(export_dir)
    return ServedExport(
        name=name, export_dir=str(export_dir), format=fmt, version=version, info=info
    )


def write_tokens(run_dir: Path, host: str, rotate: bool = False) -> dict[str, KeyState]:
    """The run's keys for a runtime listening on `host`: the inference token, and off
    loopback the metrics key (/metrics is open on loopback). Each is kept from the previous
    start when fit (tokens.read_key), else written anew; `rotate`: written anew anyway."""
    states = {INFERENCE: ensure_key(run_dir / INFERENCE_KEY_FILE, INFERENCE, rotate)}
    if not is_loopback(host):
        states[METRICS] = ensure_key(run_dir / METRICS_KEY_FILE, METRICS, rotate)
    return states


def start(
    config: RuntimeConfig,
    run_dir: Path,
    startup_timeout_s: float = 180.0,
    rotate_token: bool = False,
) -> Server:
    """Start the runtime serving `config.models`; return once /v2/health/ready is 200.
    `rotate_token`: a new inference token (and metrics key) even if the previous is fit."""
    if not config.models:
        raise ServeError("Nothing to serve: give at least one export.")
    names = [m.name for m in config.models]
    if len(set(names)) != len(names):
        raise ServeError(f"Two served models share a name: {names}.")
    run_dir = prepare(
        Launch(
            title="the KServe runtime",
            run_dir=run_dir,
            host=config.host,
            ports=[
                (config.host, config.http_port, "--port"),
                (config.host, config.grpc_port, "--grpc-port"),
            ],
            tls_cert=config.tls_cert,
            tls_key=config.tls_key,
        )
    )
    keys = write_tokens(run_dir, config.host, rotate_token)
    config = replace(
        config,
        token_file=str(keys[INFERENCE].path),
        trust=config.trust or signing.given_keys(),
        pins=signing.pins(
            [Path(m.export_dir) for m in config.models], config.trust or signing.given_keys()
        ),
        tls_cert=str(Path(config.tls_cert).resolve()) if config.tls_cert else None,
        tls_key=str(Path(config.tls_key).resolve()) if config.tls_key else None,
    )
    conf = run_dir / CONFIG_FILE
    config.write(conf)
    live.clear(run_dir)  # a new start serves what it was given, not the last run's rollout
    threads = str(max(1, config.threads))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    argv = [sys.executable, "-m", "pipeline.runtimes.kserve.supervisor", str(conf)]
    proc = spawn(argv, run_dir, "kserve.out", env)
    scheme = "https" if config.tls_cert else "http"
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"{scheme}://{host}:{config.http_port}"
    server = Server(
        served=_served(config),
        pid=proc.pid,
        run_dir=str(run_dir),
        inference_url=url,
        metrics_url=url,
        models=names,
        started=created(proc.pid),
        ca_file=config.tls_cert,
        runtime=NAME,
        markers=[CONFIG_FILE],
        trust=list(config.trust),
        pins=config.pins,
        # What this start did with each key, for `describe` (never the key itself).
        extras={
            "grpc_url": f"{host}:{config.grpc_port}",
            "token": keys[INFERENCE].action,
            **({"metrics_key": keys[METRICS].action} if METRICS in keys else {}),
        },
    )
    server.record()
    with stopped_on_failure(run_dir):
        ready = _ready_probe(server)
        wait_until(
            ready, proc, run_dir / "logs" / "kserve.out", startup_timeout_s, "The KServe runtime"
        )
        log.info("KServe runtime ready on %s", server.inference_url)
    return server


@contextlib.contextmanager
def private(exports: list[ServedExport], **settings: Any) -> Iterator[Server]:
    """A runtime of its own serving `exports` on free loopback ports from a temporary run
    folder, stopped on exit (loadtest --serve, bench). `settings` are RuntimeConfig's."""
    with tempfile.TemporaryDirectory(prefix="kserve-") as tmp:
        config = RuntimeConfig(
            models=exports, http_port=free_port(), grpc_port=free_port(), **settings
        )
        run_dir = Path(tmp) / "run"
        server = start(config, run_dir)
        try:
            yield server
        finally:
            stop(run_dir)


def _served(config: RuntimeConfig) -> dict[str, ServedInfo]:
    """What each served name holds (its ServedInfo), so
    infer, loadtest and bench find a model's served name by model and format."""
    return {
        m.name: m.info or ServedInfo.of(read_manifest(Path(m.export_dir)), m.format)
        for m in config.models
    }


def _ready_probe(server: Server) -> Callable[[], bool]:
    """True once /v2/health/ready answers 200 (every model loaded and warmed up)."""
    verify: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=server.ca_file) if server.ca_file else True
    )
    ready_url = f"{server.inference_url}/v2/health/ready"
    if "0.0.0.0" in ready_url or "[::]" in ready_url:
        ready_url = ready_url.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]")

    def ready() -> bool:
        try:
            return httpx.get(ready_url, timeout=2, verify=verify).status_code == 200
        except httpx.HTTPError:
            return False

    return ready
