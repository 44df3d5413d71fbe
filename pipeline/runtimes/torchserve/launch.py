"""Start and stop a real TorchServe over model_store/, with secure defaults.

`start()` writes `config.properties` into a run folder, starts TorchServe in its own
process group with that folder as working directory (so its token key file lands there
and nowhere else), waits until every model has a READY worker, and records the process
in `server.json`. When a model does not load, it raises with the worker's own log lines
(TorchServe's API only says the model failed; the reason is in `model_log.log`) and
stops the server.

The record and `stop()` live in server.py; workers' readiness, scaling and warm-up in
workers.py.
Clients never talk to TorchServe directly: `pipeline.runtimes.torchserve.gateway` owns the
public inference port (401 for a missing token, JSON 413, optional HTTPS) and forwards to
TorchServe's inference API on a private loopback port.

Secure defaults: TorchServe on 127.0.0.1 only (the gateway too, unless the user names
another host, with a warning), token authorization on, the model-management API
(register/delete) off, `allowed_urls` limited to the local model store, explicit
request/response size limits, one thread per worker. The management key, which can
still scale workers, stays in the owner-only `key_file.json`; clients get
`inference_key.json` (server.py).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.core import signing
from pipeline.core.paths import DEFAULT_STORE
from pipeline.runtimes.torchserve import liveops, properties
from pipeline.runtimes.torchserve import shadow as shadow_
from pipeline.runtimes.torchserve import store as store_
from pipeline.runtimes.torchserve.constants import CONFIG_PROPERTIES, KEY_FILE, NAME
from pipeline.runtimes.torchserve.gateway import CONFIG_FILE as GATEWAY_CONFIG
from pipeline.runtimes.torchserve.gateway import GatewayConfig
from pipeline.runtimes.torchserve.keys import publish_inference_key
from pipeline.runtimes.torchserve.management import MANAGEMENT
from pipeline.runtimes.torchserve.workers import scale, status, wait_ready, warm_up, worker_plan
from pipeline.serving import launcher, live
from pipeline.serving.launcher import Launch, free_port, port_free, stop
from pipeline.serving.server import (
    INFERENCE_KEY_FILE,
    ServeError,
    Server,
    default_run_dir,
    run_dir_flag,
)
from pipeline_runtime import responses

__all__ = [
    "ServeConfig",
    "ServeError",
    "Server",
    "default_run_dir",
    "free_port",
    "port_free",
    "private_config",
    "start",
    "status",
    "stop",
    "worker_plan",
]

log = logging.getLogger(__name__)
VERSION_COPY = re.compile(r".+\.v\d+")


@dataclass
class ServeConfig:
    store: Path = DEFAULT_STORE
    run_dir: Path | None = None  # default: <artifacts>/serve
    models: list[str] | None = None  # archive names (without .mar); default: all in the store
    host: str = "127.0.0.1"  # where the gateway listens; TorchServe itself stays on loopback
    inference_port: int = 8080  # the gateway's (public) port
    management_port: int = 8081
    metrics_port: int = 8082
    # gRPC listeners (TorchServe always opens them) and the base of the worker
    # socket names (/tmp/.ts.sock.<n>): None picks free ones, so that two
    # servers on one machine (a user's and the tests') never collide.
    grpc_inference_port: int | None = None
    grpc_management_port: int | None = None
    initial_worker_port: int | None = None
    max_request_size: int = 4 * 1024 * 1024  # bytes
    max_response_size: int = responses.DEFAULT_MAX_RESPONSE
    # None: from the machine (see worker_plan). Measured on 2 cores: two workers
    # with two threads each fell to ~9 requests/s, one thread per worker gave ~40.
    threads_per_worker: int | None = None
    workers_per_model: int | None = None
    token_expiration_min: int = 24 * 60
    startup_timeout_s: float = 240.0
    gpu: bool = False  # let TorchServe hand workers GPUs (number_of_gpu)
    # HTTPS on the gateway: the user's certificate chain and private key (PEM).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    response_timeout_s: float = 300.0  # the gateway's limit on one forwarded request
    # `pipeline rollout` on TorchServe registers a version's archive through the management
    # API (loopback, management key, archives from the store only: allowed_urls).
    live_versions: bool = False
    # Serve the models that load even when others fail (they are listed in
    # Server.failed and logged); by default one failure stops the start.
    keep_going: bool = False
    # Serve one archive per model (store.preferred_archives: bench's fastest, else
    # TorchScript), not every format archived: each format served costs workers.
    one_format: bool = False
    # `--shadow`: each worker re-checks a sample of its answers on eager (shadow.py).
    shadow: shadow_.ShadowConfig | None = None
    extra_properties: dict[str, str] = field(default_factory=dict)


def private_config(store: Path, run_dir: Path, **settings: Any) -> ServeConfig:
    """A server of its own (loadtest, bench): loopback, free ports, `settings` on top."""
    ports = {k: free_port() for k in ("inference_port", "management_port", "metrics_port")}
    return ServeConfig(store=store, run_dir=run_dir, **{**ports, **settings})


def _properties(config: ServeConfig, store: Path, models: list[str], backend_port: int) -> str:
    host = "127.0.0.1"  # TorchServe is never reachable from outside: the gateway is
    props = {
        "inference_address": f"http://{host}:{backend_port}",
        "management_address": f"http://{host}:{config.management_port}",
        "metrics_address": f"http://{host}:{config.metrics_port}",
        "grpc_inference_address": host,
        "grpc_management_address": host,
        "grpc_inference_port": str(config.grpc_inference_port or free_port(host)),
        "grpc_management_port": str(config.grpc_management_port or free_port(host)),
        "initial_worker_port": str(config.initial_worker_port or random.randint(10_000, 60_000)),
        "initial_distribution_port": str(random.randint(10_000, 60_000)),
        "model_store": str(store),
        "load_models": ",".join(f"{m}.mar" for m in models),
        # ShellTorch (2023) came from an open management API and unrestricted
        # model URLs: registration stays off and only the local store is allowed.
        "enable_model_api": "true" if config.live_versions else "false",
        "disable_token_authorization": "false",
        "token_expiration_min": str(config.token_expiration_min),
        "allowed_urls": f"file://{store}/.*",
        "enable_envvars_config": "false",
        "max_request_size": str(config.max_request_size),
        "max_response_size": str(config.max_response_size),
        "default_workers_per_model": "1",
        "install_py_dep_per_model": "false",
        "metrics_mode": "prometheus",
        "number_of_gpu": "1" if config.gpu else "0",
        # The shadow check's metrics are the handler's own (context.metrics): TorchServe
        # exports a custom metric only when told to register what it has not been declared.
        **({"model_metrics_auto_detect": "true"} if config.shadow else {}),
        **config.extra_properties,
    }
    return properties.text(props)


def _launch(config: ServeConfig) -> Launch:
    return Launch(
        title="TorchServe",
        run_dir=Path(config.run_dir or default_run_dir()),
        host=config.host,
        ports=[
            (config.host, config.inference_port, "--port"),
            ("127.0.0.1", config.management_port, "--management-port"),
            ("127.0.0.1", config.metrics_port, "--metrics-port"),
        ],
        tls_cert=config.tls_cert,
        tls_key=config.tls_key,
        internal=" TorchServe itself, its management and metrics APIs stay on 127.0.0.1.",
    )


def exposure_warning(config: ServeConfig) -> str | None:
    """What to tell a user who asks for the API on a non-loopback address (None on loopback)."""
    return launcher.exposure_warning(_launch(config))


def java_missing(env: dict[str, str]) -> str | None:
    """Why TorchServe's frontend would not start in `env`, or None: it runs
    `$JAVA_HOME/bin/java`, else `java` from PATH, and without one it only prints "java not
    found" into its log and exits 0."""
    java_home = env.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if java.is_file() and os.access(java, os.X_OK):
            return None
        where = f"JAVA_HOME={java_home} has no bin/java"
    elif shutil.which("java", path=env.get("PATH", os.defpath)):
        return None
    else:
        where = "no `java` on PATH and JAVA_HOME is not set"
    return (
        f"TorchServe needs Java 17, and {where}. Install a Java 17 runtime (Debian/Ubuntu: "
        "`apt-get install openjdk-17-jre-headless`) or point JAVA_HOME at one, or serve with "
        "the KServe runtime, which needs no Java: `pipeline serve --runtime kserve --model MODEL`."
    )


def store_archives(store: Path) -> list[str]:
    """The archives in `store` that `pipeline serve` may start. Not `<archive>.v<N>.mar`:
    TorchServe's copy of a version `pipeline rollout` registered (liveops.py), whose
    version lives in its store folder and is served by a rollout only."""
    found = store.glob("*.mar") if store.is_dir() else []
    return sorted(p.stem for p in found if not VERSION_COPY.fullmatch(p.stem))


def start(config: ServeConfig) -> Server:
    """Start TorchServe and return once every model is READY."""
    launch = _launch(config)
    launcher.check_tls(launch)  # what to change in the command line first, as before
    no_java = java_missing(dict(os.environ))
    if no_java:
        raise ServeError(no_java)
    store = Path(config.store).resolve()
    archives = store_archives(store)
    store_.follow_defaults(store, archives)  # a published model: its default version
    if not archives:
        raise ServeError(
            f"No archives in {store}. Run `pipeline archive` (or `make archive`) first."
            + store_.unarchived(store, archives, config.models)
        )
    try:
        models = (
            store_.expand(store, archives, config.models, every=not config.one_format)
            if config.models
            else store_.preferred_archives(store, archives)
            if config.one_format
            else archives
        )
    except ValueError as err:
        raise ServeError(
            f"{err}. Run `pipeline archive --model MODEL` first."
            + store_.unarchived(store, archives, config.models)
        ) from None
    store_.refuse_untied(store, models)  # under a trust policy
    run_dir = launcher.prepare(launch)
    # The last start's temp files go: each .pt2 load unpacked ~2.5 MB there, left behind.
    shutil.rmtree(run_dir / "tmp", ignore_errors=True)
    (run_dir / "tmp").mkdir(exist_ok=True)  # what rmtree could not remove stays
    # Before anything starts: an archive without its export is refused here.
    shadow_env = shadow_.environment(config.shadow, store, models, run_dir) if config.shadow else {}
    for stale in (KEY_FILE, INFERENCE_KEY_FILE):
        (run_dir / stale).unlink(missing_ok=True)
    conf = run_dir / CONFIG_PROPERTIES
    backend_port = free_port()
    workers, threads = worker_plan(len(models), config.workers_per_model, config.threads_per_worker)
    log.info("%d worker(s) per model, %d thread(s) per worker", workers, threads)
    conf.write_text(_properties(config, store, models, backend_port))
    env = {
        # A check asked for by an earlier shell is not this start's (handlershadow reads these).
        **{k: v for k, v in os.environ.items() if k not in shadow_.ENVIRONMENT},
        **shadow_env,
        # TorchServe keeps a pid file in the temp dir; a private one lets
        # several servers (tests, users) run side by side.
        "TMPDIR": str(run_dir / "tmp"),
        "LOG_LOCATION": str(run_dir / "logs"),
        "METRICS_LOCATION": str(run_dir / "logs"),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PIPELINE_WORKER_THREADS": str(threads),
        responses.MAX_RESPONSE_ENV: str(config.max_response_size),  # the handler's to keep
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    exe = Path(sys.executable).parent / "torchserve"
    if not exe.exists():
        raise ServeError(f"torchserve is not installed next to {sys.executable}; run `make venv`.")
    argv = [str(exe), "--start", "--foreground", "--ts-config", str(conf)]
    argv += ["--model-store", str(store), "--ncs"]
    # umask 077: TorchServe creates key_file.json with the default mode and only
    # then narrows it to rw-------; born owner-only, nobody can open it in between.
    live.clear(run_dir)  # a new start serves the store, not the last run's rollout
    proc = launcher.spawn(argv, run_dir, "torchserve.out", env, umask=0o077)
    host = f"[{config.host}]" if ":" in config.host else config.host
    server = Server(
        runtime=NAME,
        markers=[CONFIG_PROPERTIES, GATEWAY_CONFIG],
        pid=proc.pid,
        run_dir=str(run_dir),
        inference_url=f"{'https' if config.tls_cert else 'http'}://{host}:{config.inference_port}",
        metrics_url=f"http://127.0.0.1:{config.metrics_port}",
        models=models,
        started=launcher.created(proc.pid),
        extras={
            "management_url": f"http://127.0.0.1:{config.management_port}",
            "backend_url": f"http://127.0.0.1:{backend_port}",
            "store": str(store),
            **({"live_versions": "on"} if config.live_versions else {}),
            **({"shadow": shadow_.summary(config.shadow)} if config.shadow else {}),
        },
        ca_file=str(Path(config.tls_cert).resolve()) if config.tls_cert else None,
        served=store_.archive_infos(store, models),
        key_files={MANAGEMENT: KEY_FILE},
        trust=signing.given_keys(),
    )
    server.record()
    with launcher.stopped_on_failure(run_dir):
        failed = wait_ready(server, proc, config.startup_timeout_s, config.keep_going)
        publish_inference_key(run_dir)
        if failed:
            server = replace(server, failed=sorted(failed))
            server.record()
        if workers > 1:
            scale(server, [m for m in models if m not in failed], workers)
        if config.live_versions:  # so the gateway names the answering version from the start
            live.write(run_dir, liveops.initial_state(server))
        server = _start_gateway(server, config, run_dir)
        warm_up(server, store, [m for m in models if m not in failed])
    return server


def _start_gateway(server: Server, config: ServeConfig, run_dir: Path) -> Server:
    gw = GatewayConfig(
        host=config.host,
        port=config.inference_port,
        upstream=server.extras["backend_url"],
        key_file=str(run_dir / KEY_FILE),
        max_request_size=config.max_request_size,
        timeout_s=config.response_timeout_s,
        tls_cert=str(Path(config.tls_cert).resolve()) if config.tls_cert else None,
        tls_key=str(Path(config.tls_key).resolve()) if config.tls_key else None,
        log_file=str(run_dir / "logs" / "gateway.log"),
        server_pid=server.pid,
        aliases=store_.aliases(server),
        run_dir=str(run_dir),
    )
    gw.write(run_dir / GATEWAY_CONFIG)
    argv = [
        sys.executable,
        "-m",
        "pipeline.runtimes.torchserve.gateway",
        str(run_dir / GATEWAY_CONFIG),
    ]
    proc = launcher.spawn(argv, run_dir, "gateway.out")
    server = replace(server, pids={**server.pids, "gateway": proc.pid})
    server.record()
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host

    started = run_dir / "logs" / "gateway.log"

    def listening() -> bool:
        # A connect alone proves nothing: another server on the port accepts it while the
        # gateway exits with "address in use". The gateway logs "gateway on" once bound.
        try:
            if "gateway on " not in started.read_text(errors="replace"):
                return False
            with socket.create_connection((host, config.inference_port), timeout=1):
                return True
        except OSError:
            return False

    launcher.wait_until(listening, proc, run_dir / "logs" / "gateway.out", 30, "The gateway")
    log.info("gateway listening on %s", server.inference_url)
    return server


def describe(server: Server) -> list[str]:
    """What `pipeline serve` prints about a started TorchServe: paths, never a key (this
    output ends up in terminals, CI logs and tickets)."""
    from pipeline.runtimes.torchserve.workers import footprint

    run_dir = Path(server.run_dir)
    lines = []
    if server.failed:
        lines.append(f"NOT serving (failed to load, see the log): {', '.join(server.failed)}")
    workers, worker_mb, total_mb = footprint(server)
    said = server.extras.get("shadow")
    shadow = (
        [
            f"  shadow:     {said}; pipeline_shadow_* on the metrics, divergences in "
            f"{run_dir / 'shadow'}"
        ]
        if said
        else []
    )
    return [
        *lines,
        f"TorchServe is up (pid {server.pid}), serving: {', '.join(server.models)}",
        f"  workers:    {workers} for {len(server.models) - len(server.failed)} model(s), "
        f"{worker_mb:,.0f} MiB; {total_mb:,.0f} MiB with TorchServe's frontend and the gateway",
        f"  inference:  {server.inference_url}/predictions/<model> (gateway pid {server.pids['gateway']})",
        f"  management: {server.extras['management_url']} ("
        + (
            "register: archives from the store only, for `pipeline rollout` (--live-versions)"
            if server.extras.get("live_versions")
            else "register/delete disabled"
        )
        + "; scaling needs the management key, kept for `pipeline serve` only)",
        f"  metrics:    {server.metrics_url}/metrics",
        *shadow,
        f"  token:      {run_dir / INFERENCE_KEY_FILE} (for clients: send "
        "'Authorization: Bearer <its inference key>')",
        f"  private:    {run_dir / KEY_FILE} (mode 0600: management and API keys, share it with "
        "no one)",
        f"  logs:       {run_dir / 'logs'}",
        f"stop it with `pipeline stop{run_dir_flag(run_dir)}`"
        + ("" if run_dir_flag(run_dir) else " (or `make stop`)"),
    ]
