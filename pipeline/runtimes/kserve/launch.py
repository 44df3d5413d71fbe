"""Start and stop the KServe runtime for `pipeline serve --runtime kserve`.

`start` writes the runtime's config to `<run_dir>/kserve.json` and a fresh
inference token to `<run_dir>/inference_key.json` (mode 0600, the shape
TorchServe's clients read: `{"inference": {"key": ...}}`), starts
`python -m pipeline.runtimes.kserve.runtime <run_dir>/kserve.json` in its own session,
waits until `/v2/health/ready` answers 200 (every model loaded and warmed up)
and records a `server.json` that `pipeline stop` (`pipeline.serving.launcher.stop`)
recognises and stops.

Nothing here imports kserve (it parses sys.argv on import).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psutil

from pipeline.core.manifest import read_manifest
from pipeline.formats import base as registry
from pipeline.runtimes.kserve import NAME
from pipeline.runtimes.kserve.config import CONFIG_FILE, RuntimeConfig, ServedExport
from pipeline.serving import served
from pipeline.serving.launcher import free_port, port_free, stop
from pipeline.serving.provenance import ArchiveInfo
from pipeline.serving.server import (
    INFERENCE_KEY_FILE,
    SERVER_FILE,
    ServeError,
    Server,
)

log = logging.getLogger(__name__)

__all__ = ["private", "served_export", "start", "stop", "write_token"]


def served_export(
    export_dir: Path, fmt: str | None = None, name: str | None = None
) -> ServedExport:
    """The export at `export_dir` as one served model: format `fmt` (default: the one
    `pipeline serve` would serve, `served.export_format`) under `name` (default: the model's name,
    with characters a URL path segment should not hold replaced by '_')."""
    export_dir = Path(export_dir).resolve()
    manifest = read_manifest(export_dir)
    order = registry.keys()
    held = [k for k in order if k in manifest.artifacts]
    if fmt is None:
        if not held:
            raise ServeError(f"{export_dir} holds no artifact to serve; re-run `pipeline export`.")
        fmt = served.export_format(manifest)
    elif fmt not in held:
        raise ServeError(
            f"{export_dir} has no {fmt!r} artifact; it holds {', '.join(held) or 'none'}."
        )
    name = name or re.sub(r"[^A-Za-z0-9_.\-]", "_", manifest.model.name)
    return ServedExport(name=name, export_dir=str(export_dir), format=fmt)


def write_token(run_dir: Path) -> Path:
    """A fresh inference key in `run_dir/inference_key.json`, created 0600."""
    target = run_dir / INFERENCE_KEY_FILE
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"inference": {"key": secrets.token_urlsafe(32)}}, fh, indent=2)
    tmp.replace(target)
    return target


def start(config: RuntimeConfig, run_dir: Path, startup_timeout_s: float = 180.0) -> Server:
    """Start the runtime serving `config.models`; return once /v2/health/ready is 200."""
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not config.models:
        raise ServeError("Nothing to serve: give at least one export.")
    names = [m.name for m in config.models]
    if len(set(names)) != len(names):
        raise ServeError(f"Two served models share a name: {names}.")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ServeError("HTTPS needs both --tls-cert and --tls-key.")
    for pem in (config.tls_cert, config.tls_key):
        if pem and not Path(pem).is_file():
            raise ServeError(f"TLS file {pem} does not exist.")
    if (run_dir / SERVER_FILE).is_file():
        old = Server.load(run_dir)
        if old.alive():
            raise ServeError(
                f"A server is already running from {run_dir} (pid {old.pid}); stop it with "
                "`pipeline stop`."
            )
        (run_dir / SERVER_FILE).unlink()
    for port in (config.http_port, config.grpc_port):
        if not port_free(config.host, port):
            raise ServeError(
                f"Port {port} on {config.host} is in use; pick others with --port/--grpc-port."
            )
    if config.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "serving on %s, not loopback: anyone who can reach it and holds the token can use it%s",
            config.host,
            "" if config.tls_cert else "; the token travels in clear text without --tls-cert",
        )
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    config = replace(
        config,
        token_file=str(write_token(run_dir)),
        tls_cert=str(Path(config.tls_cert).resolve()) if config.tls_cert else None,
        tls_key=str(Path(config.tls_key).resolve()) if config.tls_key else None,
    )
    conf = run_dir / CONFIG_FILE
    config.write(conf)
    threads = str(max(1, config.threads))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    out_path = logs / "kserve.out"
    with out_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.runtimes.kserve.runtime", str(conf)],
            cwd=run_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    scheme = "https" if config.tls_cert else "http"
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"{scheme}://{host}:{config.http_port}"
    server = Server(
        archives=_archives(config),
        pid=proc.pid,
        run_dir=str(run_dir),
        inference_url=url,
        management_url="",
        metrics_url=url,
        models=names,
        started=psutil.Process(proc.pid).create_time(),
        ca_file=config.tls_cert,
        runtime=NAME,
        markers=[CONFIG_FILE],
        grpc_url=f"{host}:{config.grpc_port}",
    )
    server.record()
    try:
        _wait_ready(server, proc, out_path, startup_timeout_s)
    except BaseException:
        stop(run_dir)
        raise
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


def _archives(config: RuntimeConfig) -> dict[str, ArchiveInfo]:
    """What each served name holds, as TorchServe's archives record it (`archive.json`), so
    infer, loadtest and bench find a model's served name by model and format."""
    out = {}
    for m in config.models:
        manifest = read_manifest(Path(m.export_dir))
        out[m.name] = ArchiveInfo.of(manifest, m.format)
    return out


def _wait_ready(server: Server, proc: subprocess.Popen, out: Path, timeout_s: float) -> None:
    verify: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=server.ca_file) if server.ca_file else True
    )
    deadline = time.monotonic() + timeout_s
    ready_url = f"{server.inference_url}/v2/health/ready"
    if "0.0.0.0" in ready_url or "[::]" in ready_url:
        ready_url = ready_url.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]")
    while True:
        if proc.poll() is not None:
            tail = out.read_text(errors="replace")[-3000:]
            raise ServeError(f"The KServe runtime exited with status {proc.returncode}:\n{tail}")
        try:
            if httpx.get(ready_url, timeout=2, verify=verify).status_code == 200:
                log.info("KServe runtime ready on %s", server.inference_url)
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            tail = out.read_text(errors="replace")[-3000:]
            raise ServeError(f"The KServe runtime was not ready within {timeout_s:.0f} s:\n{tail}")
        time.sleep(0.2)
