"""Start and stop a real TorchServe over model_store/, with secure defaults.

`start()` writes `config.properties` into a run folder, starts TorchServe in
its own process group with that folder as working directory (so its token
key file lands there and nowhere else), waits until every model has a READY
worker, and records the process in `server.json`. When a model does not load,
it raises with the worker's own log lines (TorchServe's API only says the
model failed; the reason is in `model_log.log`) and stops the server.

Clients never talk to TorchServe directly: `pipeline.gateway` owns the public
inference port (401 for a missing token, JSON 413, optional HTTPS) and
forwards to TorchServe's inference API on a private loopback port.

Secure defaults: TorchServe on 127.0.0.1 only (the gateway too, unless the
user names another host, with a warning), token authorization on, the
model-management API (register/delete) off, `allowed_urls` limited to the
local model store, explicit request/response size limits, one thread per
worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil

from pipeline import paths
from pipeline.archive import DEFAULT_STORE
from pipeline.errors import PipelineError
from pipeline.gateway import CONFIG_FILE as GATEWAY_CONFIG
from pipeline.gateway import GatewayConfig

log = logging.getLogger(__name__)

SERVER_FILE = "server.json"
KEY_FILE = "key_file.json"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServeError(PipelineError):
    """TorchServe could not be started, reached or stopped."""


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
    max_response_size: int = 16 * 1024 * 1024
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
    # Serve the models that load even when others fail (they are listed in
    # Server.failed and logged); by default one failure stops the start.
    keep_going: bool = False
    # Serve one format per model where `pipeline bench` recorded the fastest
    # verified backend in the archived manifest (the others where it did not).
    fastest_only: bool = False
    extra_properties: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Server:
    """A running TorchServe, as recorded in server.json."""

    pid: int
    run_dir: str
    inference_url: str
    management_url: str
    metrics_url: str
    models: list[str]
    started: float = 0.0  # the launcher's process creation time (psutil), to recognise it later
    backend_url: str = ""  # TorchServe's own inference API (loopback, behind the gateway)
    gateway_pid: int = 0
    gateway_started: float = 0.0
    # For HTTPS: the certificate clients trust (the server's own, for a self-signed one).
    ca_file: str | None = None
    failed: list[str] = field(default_factory=list)  # models that did not load (keep_going)

    @classmethod
    def load(cls, run_dir: Path) -> Server:
        path = Path(run_dir) / SERVER_FILE
        if not path.is_file():
            raise ServeError(
                f"No server is running from {run_dir} ({path} is missing). Start one with `pipeline serve`."
            )
        return cls(**json.loads(path.read_text()))

    def keys(self) -> dict[str, str]:
        """The tokens TorchServe wrote: {'inference': ..., 'management': ...}."""
        path = Path(self.run_dir) / KEY_FILE
        try:
            data = json.loads(path.read_text())
            return {"inference": data["inference"]["key"], "management": data["management"]["key"]}
        except (OSError, ValueError, KeyError) as err:
            raise ServeError(f"Cannot read TorchServe's token file {path}: {err}") from None

    def alive(self) -> bool:
        """True only if the recorded pid is still *our* launcher (pids are reused)."""
        return _is_process(self.pid, Path(self.run_dir) / "config.properties")

    def gateway_alive(self) -> bool:
        return _is_process(self.gateway_pid, Path(self.run_dir) / GATEWAY_CONFIG)


def _is_process(pid: int, marker: Path) -> bool:
    """Is `pid` a live process started with `marker` (its config file) on its command line?

    The command line, not the start time, identifies our processes: a reused
    pid runs something else, and start times read back from /proc can drift
    by more than a second under load.
    """
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and str(marker) in proc.cmdline()
    except psutil.Error:
        return False


def _orphans(run_dir: Path) -> list[int]:
    """Pids of TorchServe launchers and gateways started from `run_dir` (found by command line)."""
    markers = {str(run_dir / "config.properties"), str(run_dir / GATEWAY_CONFIG)}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        pid = proc.info["pid"]
        if markers.intersection(cmdline) and pid != os.getpid():
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:  # the group leaders we started, not java inside
                    found.append(pid)
    return found


def default_run_dir() -> Path:
    return paths.artifacts_root() / "serve"


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
        "enable_model_api": "false",
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
        **config.extra_properties,
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _model_errors(run_dir: Path, limit: int = 30) -> str:
    log_file = run_dir / "logs" / "model_log.log"
    if not log_file.is_file():
        return "(no model_log.log was written)"
    lines = log_file.read_text(errors="replace").splitlines()
    picked = [
        ln
        for ln in lines
        if any(w in ln for w in ("Error", "ERROR", "Traceback", "Refusing", "raise"))
    ]
    return "\n".join((picked or lines)[-limit:])


# The served format that runs each benchmarked backend's artifact.
_SERVED_SUFFIX = {
    "onnxruntime": "onnx",
    "pt2": "pt2",
    "cpp/pt2": "pt2",
    "torchscript": "ts",
    "torchscript_frozen": "ts",
    "cpp": "ts",
    "eager": "ts",
}


def _fastest_backend(mar: Path) -> str | None:
    try:
        with zipfile.ZipFile(mar) as zf:
            return json.loads(zf.read("manifest.json")).get("fastest", {}).get("backend")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def preferred_archives(store: Path, archives: list[str]) -> list[str]:
    """One archive per model whose manifest names a measured fastest backend; all others kept."""
    by_model: dict[str, list[str]] = {}
    chosen: list[str] = []
    for name in archives:
        base, _, suffix = name.rpartition("_")
        if base and suffix in set(_SERVED_SUFFIX.values()):
            by_model.setdefault(base, []).append(name)
        else:
            chosen.append(name)
    for base, names in by_model.items():
        fastest = _fastest_backend(store / f"{names[0]}.mar")
        pick = f"{base}_{_SERVED_SUFFIX[fastest]}" if fastest in _SERVED_SUFFIX else None
        if pick in names and len(names) > 1:
            log.info("%s: serving %s, the fastest verified backend (%s)", base, pick, fastest)
            chosen.append(pick)
        else:
            chosen += names
    return sorted(chosen)


def exposure_warning(config: ServeConfig) -> str | None:
    """What to tell a user who asks for the API on a non-loopback address (None on loopback)."""
    if config.host in LOOPBACK:
        return None
    clear = (
        "" if config.tls_cert else ", and tokens travel in clear text (use --tls-cert/--tls-key)"
    )
    return (
        f"The inference API will listen on {config.host}, not loopback: anyone who can reach "
        f"this machine can try it{clear}. Keep the token file private. TorchServe itself, its "
        "management and metrics APIs stay on 127.0.0.1."
    )


def start(config: ServeConfig) -> Server:
    """Start TorchServe and return once every model is READY."""
    store = Path(config.store).resolve()
    run_dir = Path(config.run_dir or default_run_dir()).resolve()
    warning = exposure_warning(config)
    if warning:
        log.warning("%s", warning)
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ServeError("HTTPS needs both --tls-cert and --tls-key.")
    for pem in (config.tls_cert, config.tls_key):
        if pem and not Path(pem).is_file():
            raise ServeError(f"TLS file {pem} does not exist.")
    archives = sorted(p.stem for p in store.glob("*.mar")) if store.is_dir() else []
    models = config.models or (
        preferred_archives(store, archives) if config.fastest_only else archives
    )
    missing = [m for m in models if m not in archives]
    if not models or missing:
        raise ServeError(
            f"No archive(s) {missing or ''} in {store}. Run `pipeline archive` (or `make archive`) first."
        )
    existing = run_dir / SERVER_FILE
    if existing.is_file():
        old = Server.load(run_dir)
        if old.alive():
            raise ServeError(
                f"TorchServe is already running from {run_dir} (pid {old.pid}); stop it with `pipeline stop`."
            )
        existing.unlink()
    for host, port in (
        (config.host, config.inference_port),
        ("127.0.0.1", config.management_port),
        ("127.0.0.1", config.metrics_port),
    ):
        if not _port_free(host, port):
            raise ServeError(
                f"Port {port} on {config.host} is in use; pick others with --port/--management-port/--metrics-port."
            )

    # A fresh log per start: errors left by an earlier run must not be read
    # as this run's (the previous logs stay in logs.previous/).
    if (run_dir / "logs").exists():
        shutil.rmtree(run_dir / "logs.previous", ignore_errors=True)
        (run_dir / "logs").rename(run_dir / "logs.previous")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "tmp").mkdir(exist_ok=True)
    (run_dir / KEY_FILE).unlink(missing_ok=True)
    conf = run_dir / "config.properties"
    backend_port = free_port()
    workers, threads = worker_plan(len(models), config.workers_per_model, config.threads_per_worker)
    log.info("%d worker(s) per model, %d thread(s) per worker", workers, threads)
    conf.write_text(_properties(config, store, models, backend_port))
    env = {
        **os.environ,
        # TorchServe keeps a pid file in the temp dir; a private one lets
        # several servers (tests, users) run side by side.
        "TMPDIR": str(run_dir / "tmp"),
        "LOG_LOCATION": str(run_dir / "logs"),
        "METRICS_LOCATION": str(run_dir / "logs"),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PIPELINE_WORKER_THREADS": str(threads),
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    exe = Path(sys.executable).parent / "torchserve"
    if not exe.exists():
        raise ServeError(f"torchserve is not installed next to {sys.executable}; run `make venv`.")
    cmd = [
        str(exe),
        "--start",
        "--foreground",
        "--ts-config",
        str(conf),
        "--model-store",
        str(store),
        "--ncs",
    ]
    with (run_dir / "logs" / "torchserve.out").open("ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    host = f"[{config.host}]" if ":" in config.host else config.host
    server = Server(
        pid=proc.pid,
        run_dir=str(run_dir),
        inference_url=f"{'https' if config.tls_cert else 'http'}://{host}:{config.inference_port}",
        management_url=f"http://127.0.0.1:{config.management_port}",
        metrics_url=f"http://127.0.0.1:{config.metrics_port}",
        models=models,
        started=psutil.Process(proc.pid).create_time(),
        backend_url=f"http://127.0.0.1:{backend_port}",
        ca_file=str(Path(config.tls_cert).resolve()) if config.tls_cert else None,
    )
    _record(server)
    try:
        failed = _wait_ready(server, proc, config.startup_timeout_s, config.keep_going)
        if failed:
            server = replace(server, failed=sorted(failed))
        if workers > 1:
            _scale(server, [m for m in models if m not in failed], workers)
        server = _start_gateway(server, config, run_dir)
        _warm_up(server, store, [m for m in models if m not in failed])
    except BaseException:
        stop(run_dir)
        raise
    return server


def worker_plan(
    n_models: int, workers: int | None = None, threads: int | None = None
) -> tuple[int, int]:
    """Workers per model and threads per worker that fill the machine without oversubscribing.

    One thread per worker and as many workers as the physical cores allow:
    intra-op threads that outnumber the cores make the workers fight (two
    workers × two threads on 2 cores fell from ~40 to ~9 requests/s), while
    more single-threaded workers serve concurrent batches in parallel.
    """
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    workers = workers or max(1, cores // max(1, n_models))
    threads = threads or max(1, cores // max(1, n_models * workers))
    return workers, threads


def _scale(server: Server, models: list[str], workers: int) -> None:
    headers = {"Authorization": f"Bearer {server.keys()['management']}"}
    for name in models:
        resp = httpx.put(
            f"{server.management_url}/models/{name}",
            params={"min_worker": workers, "max_worker": workers, "synchronous": "true"},
            headers=headers,
            timeout=300,
        )
        if resp.status_code != 200:
            log.warning("could not scale %s to %d workers: %s", name, workers, resp.text[:200])


def _warm_up(server: Server, store: Path, models: list[str]) -> None:
    """One real prediction per model through the gateway, with the archive's golden inputs.

    Handlers warm their model up in `initialize`, but the first request still
    paid for everything around it: the gateway's connection to TorchServe, the
    Java frontend's first pass through its prediction path (JIT) and the
    worker's request decoding, about 50 ms against 5 ms steady for the digits
    CNN. Paying that here keeps it off the first user's request.
    """
    import io

    import torch

    from pipeline.client import numpy_body, post

    for name in models:
        try:
            with zipfile.ZipFile(store / f"{name}.mar") as zf:
                golden = torch.load(
                    io.BytesIO(zf.read("golden.pt")), map_location="cpu", weights_only=True
                )
            body = numpy_body({k: v[:1] for k, v in golden["inputs"].items()})
            resp = post(server, name, body, "application/octet-stream", timeout=60, retries=2)
            if resp.status_code != 200:
                log.warning("warm-up request to %s answered %d", name, resp.status_code)
        except Exception as err:  # noqa: BLE001 - a warm-up failure must not stop the server
            log.warning("could not warm up %s: %s", name, err)


def _record(server: Server) -> None:
    (Path(server.run_dir) / SERVER_FILE).write_text(json.dumps(asdict(server), indent=2))


def _start_gateway(server: Server, config: ServeConfig, run_dir: Path) -> Server:
    gw = GatewayConfig(
        host=config.host,
        port=config.inference_port,
        upstream=server.backend_url,
        key_file=str(run_dir / KEY_FILE),
        max_request_size=config.max_request_size,
        timeout_s=config.response_timeout_s,
        tls_cert=str(Path(config.tls_cert).resolve()) if config.tls_cert else None,
        tls_key=str(Path(config.tls_key).resolve()) if config.tls_key else None,
        log_file=str(run_dir / "logs" / "gateway.log"),
        server_pid=server.pid,
    )
    gw.write(run_dir / GATEWAY_CONFIG)
    with (run_dir / "logs" / "gateway.out").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.gateway", str(run_dir / GATEWAY_CONFIG)],
            cwd=run_dir,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = replace(
        server, gateway_pid=proc.pid, gateway_started=psutil.Process(proc.pid).create_time()
    )
    _record(server)
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            out_text = (run_dir / "logs" / "gateway.out").read_text(errors="replace")
            raise ServeError(
                f"The gateway exited with status {proc.returncode}:\n{out_text[-2000:]}"
            )
        try:
            with socket.create_connection((host, config.inference_port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise ServeError(
                    f"The gateway did not open port {config.inference_port} within 30 s."
                ) from None
            time.sleep(0.1)
    log.info("gateway listening on %s", server.inference_url)
    return server


def _wait_ready(
    server: Server, proc: subprocess.Popen, timeout: float, keep_going: bool = False
) -> set[str]:
    """Wait for every model's READY worker; return the ones that failed (keep_going only)."""
    deadline = time.monotonic() + timeout
    pending = set(server.models)
    failed: set[str] = set()
    while pending:
        if proc.poll() is not None:
            raise ServeError(
                f"TorchServe exited with status {proc.returncode} while starting. Its output is in "
                f"{server.run_dir}/logs/torchserve.out; model errors:\n{_model_errors(Path(server.run_dir))}"
            )
        if time.monotonic() > deadline:
            raise ServeError(
                f"Model(s) {sorted(pending)} not READY after {timeout:.0f} s. The worker log says:\n"
                f"{_model_errors(Path(server.run_dir))}"
            )
        time.sleep(0.5)
        if not (Path(server.run_dir) / KEY_FILE).is_file():
            continue
        try:
            headers = {"Authorization": f"Bearer {server.keys()['management']}"}
        except ServeError:
            continue  # TorchServe is still writing the file: read it on the next turn
        for name in sorted(pending):
            try:
                resp = httpx.get(
                    f"{server.management_url}/models/{name}", headers=headers, timeout=5
                )
            except httpx.HTTPError:
                break  # not listening yet
            if resp.status_code == 200:
                workers = resp.json()[0].get("workers", [])
                if any(w.get("status") == "READY" for w in workers):
                    pending.discard(name)
                    log.info("%s is READY", name)
                elif _failed_to_load(server, name):
                    message = f"Model {name} failed to load. The worker log says:\n{_model_errors(Path(server.run_dir))}"
                    if not keep_going:
                        raise ServeError(message)
                    log.error("%s\nServing the other models (keep_going).", message)
                    pending.discard(name)
                    failed.add(name)
    if failed == set(server.models):
        raise ServeError(
            f"No model loaded; the worker log says:\n{_model_errors(Path(server.run_dir))}"
        )
    return failed


def _failed_to_load(server: Server, name: str) -> bool:
    log_file = Path(server.run_dir) / "logs" / "model_log.log"
    if not log_file.is_file():
        return False
    text = log_file.read_text(errors="replace")
    # Only this model's worker lines count (W-<port>-<model>_<version>).
    mine = [ln for ln in text.splitlines() if f"-{name}_1.0" in ln]
    return any("Traceback" in ln or "Backend worker process died" in ln for ln in mine)


def stop(run_dir: Path | None = None, timeout: float = 30.0) -> bool:
    """Stop the server started from `run_dir`; True if one was running."""
    run_dir = Path(run_dir or default_run_dir()).resolve()
    path = run_dir / SERVER_FILE
    was_running = False
    if path.is_file():
        server = Server.load(run_dir)
        if server.gateway_alive():
            _kill_group(server.gateway_pid, timeout)
        was_running = server.alive()
        if was_running:  # else a stale record: the pid may belong to someone else by now
            _kill_group(server.pid, timeout)  # the launcher, java and every worker share the group
    # Whatever is left from this run folder (a record lost, a killed test run): each is a
    # session leader, so its group holds java and the workers.
    for pid in _orphans(run_dir):
        log.warning("stopping process %d left over from %s", pid, run_dir)
        _kill_group(pid, timeout)
        was_running = True
    path.unlink(missing_ok=True)
    (run_dir / KEY_FILE).unlink(missing_ok=True)
    return was_running


def _kill_group(pgid: int, timeout: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.1)
        if not _group_alive(pgid):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    # Zombies of our own children still count as a group: reap what we can.
    try:
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def status(run_dir: Path | None = None) -> dict[str, Any]:
    """Models and worker states of the running server."""
    server = Server.load(Path(run_dir or default_run_dir()))
    headers = {"Authorization": f"Bearer {server.keys()['management']}"}
    out = {}
    for name in server.models:
        resp = httpx.get(f"{server.management_url}/models/{name}", headers=headers, timeout=5)
        out[name] = (
            [w.get("status") for w in resp.json()[0].get("workers", [])]
            if resp.status_code == 200
            else resp.status_code
        )
    return out
