"""The Ray runtime's own process: `python -m pipeline.runtimes.ray.host <run_dir>/ray.json`.

It starts a local Ray cluster on 127.0.0.1 (a head and `worker_nodes` worker nodes, each
a `ray._private.node.Node` as Ray's own tests start them, one at a time: nodes started
together race for ports), or joins the one at `address`; starts Serve with one HTTP
proxy, on the head, on --host/--port; deploys the application (app.py); writes what it
started to ray_state.json (every node's GCS and raylet pids, the replicas' processes
and nodes) and then waits. SIGTERM (`pipeline stop`) ends it: a cluster it joined
loses only this run's application; a cluster it started goes with it, since every Ray
process it started is in its process group, which `pipeline stop` signals.

Why `Cluster` and not `ray start`: `ray start` listens on every interface and the host's
address (and leaves a Ray client server on port 10001 behind); these nodes listen on
127.0.0.1 only (docs/notes/ray-serve-research.md). The driver connects over loopback
only with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in every Ray process's environment, which
the launcher sets (constants.RAY_ENV).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pipeline.runtimes.ray.constants import (
    APP_PREFIX,
    HEAD_RESOURCE,
    LOOPBACK_ENV,
    STATE_FILE,
    deployment_name,
)

log = logging.getLogger("pipeline.runtimes.ray")
MiB = 2**20


def app_name(run_dir: Path) -> str:
    """This run's Serve application: one per run folder, so runs sharing a cluster differ."""
    import hashlib

    return f"{APP_PREFIX}-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]}"


def _start_cluster(config: dict[str, Any]) -> Any:
    from ray.cluster_utils import Cluster

    common = {
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
        "object_store_memory": config["object_store_mb"] * MiB,
    }
    spread = config["worker_nodes"] > 0
    head = {
        **common,
        # With worker nodes, the head holds the proxy and the ingress only: replicas go to
        # the worker nodes, so losing one never takes the ingress with it.
        "num_cpus": 0 if spread else config["node_cpus"],
        "resources": {HEAD_RESOURCE: 1},
    }
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for i in range(config["worker_nodes"]):
        cluster.add_node(num_cpus=config["node_cpus"], **common)
        log.info("worker node %d of %d joined", i + 1, config["worker_nodes"])
    return cluster


def _node_record(node: Any, head: bool) -> dict[str, Any]:
    from pipeline.runtimes.ray.reaper import raylet_alive

    procs = node.all_processes
    pids = {k: [p.process.pid for p in v] for k, v in procs.items()}
    return {
        "node_id": node.node_id,
        "head": head,
        "raylet_pid": pids.get("raylet", [None])[0],
        "pids": pids,
        # A lost node stays listed, marked: loadtest counts only the live ones.
        "dead": not raylet_alive(node),
    }


def replicas(actors: list[dict[str, Any]], name: str, app: str) -> list[dict[str, Any]]:
    """`name`'s live replicas (pid, node) among the GCS's live `actors`: no dashboard
    needed, and no request sent to a replica. Ray names a replica's actor class
    `ServeReplica:<app>:<deployment>`."""
    wanted = f"ServeReplica:{app}:{deployment_name(name)}"
    return sorted(
        (
            {"pid": a["Pid"], "node_id": a["Address"]["NodeID"]}
            for a in actors
            if a["ActorClassName"] == wanted
        ),
        key=lambda r: (r["node_id"], r["pid"]),
    )


def serve_processes(actors: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Serve's own processes (its controller, the HTTP proxy) by actor class: recorded
    beside the nodes' so the run folder names every process the run started."""
    out: dict[str, list[int]] = {}
    for actor in actors:
        if actor["ActorClassName"] in ("ServeController", "ProxyActor"):
            out.setdefault(actor["ActorClassName"], []).append(actor["Pid"])
    return out


def _adopt_orphans() -> None:
    """Become the child subreaper (Linux): a Ray worker whose raylet dies is reparented to
    this process, which reaps it, instead of to PID 1 (which in a container may never
    reap it, leaving a zombie per worker after `pipeline stop`)."""
    import ctypes

    pr_set_child_subreaper = 36
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def _end_descendants(timeout_s: float) -> None:
    """SIGTERM every process this one started (the cluster's and, adopted, their workers),
    SIGKILL what is left after `timeout_s`, and reap them all."""
    import psutil

    from pipeline.runtimes.ray.reaper import reap

    me = psutil.Process()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reap()
            alive = [c for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
            if not alive:
                break
            time.sleep(0.1)
    reap()


def write_state(run_dir: Path, config: dict[str, Any], cluster: Any, app: str, url: str) -> bool:
    """Write ray_state.json if what it says changed; True when it was written. The GCS's
    actor table is read once for every model and Serve's own processes."""
    from ray._private import state as ray_state

    actors = [a for a in ray_state.actors().values() if a["State"] == "ALIVE"]
    nodes = []
    if cluster is not None:
        nodes.append(_node_record(cluster.head_node, True))
        nodes += [_node_record(n, False) for n in cluster.worker_nodes]
    state = {
        "app": app,
        "url": url,  # where Serve's proxy listens (a joined cluster's may not be --port)
        "address": cluster.address if cluster is not None else config["address"],
        "owns_cluster": cluster is not None,
        "nodes": nodes,
        "replicas": {m["name"]: replicas(actors, m["name"], app) for m in config["models"]},
        "serve_pids": serve_processes(actors),
        "ray_logs": config.get("ray_logs"),
    }
    text = json.dumps(state, indent=1)
    path = run_dir / STATE_FILE
    if path.is_file() and path.read_text() == text:
        return False
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def _refresh(run_dir: Path, config: dict[str, Any], cluster: Any, app: str, url: str) -> None:
    from pipeline.runtimes.ray.reaper import Orphans, tend

    orphans = Orphans()
    while True:
        time.sleep(0.5)
        if cluster is not None:  # a lost node's processes: reaped, and its orphans ended
            try:
                tend([cluster.head_node, *cluster.worker_nodes], orphans)
            except Exception as err:  # noqa: BLE001 - never let it stop the refresh
                log.warning("lost nodes' processes not tended: %s", err)
        try:
            write_state(run_dir, config, cluster, app, url)
        except Exception as err:  # noqa: BLE001 - a GCS busy with a lost node: try again
            log.debug("state not refreshed: %s", err)


def gpus_short(wanted: float, resources: dict[str, float]) -> str | None:
    """Why no replica could be placed, when each wants `wanted` GPUs and the cluster has
    fewer than that; None when they fit (or want none)."""
    have = float(resources.get("GPU", 0))
    if not wanted or have >= wanted:
        return None
    return (
        f"--ray-replica-gpus {wanted:g}: the cluster has {have:g} GPU(s), so no replica "
        "could be placed; serve on CPU (without --ray-replica-gpus) or add GPU nodes"
    )


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    conf = Path(argv[0])
    config = json.loads(conf.read_text())
    run_dir = conf.parent
    stop: list[int] = []

    def on_stop() -> None:
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        signal.signal(signal.SIGINT, lambda *_: stop.append(1))

    on_stop()

    if not config["address"]:
        _adopt_orphans()
        # Read by the replicas (app.py): their inter-deployment gRPC server on loopback.
        os.environ[LOOPBACK_ENV] = "1"

    import ray
    from ray import serve

    from pipeline.runtimes.ray.app import build
    from pipeline.runtimes.ray.deploying import wait_running

    began = time.monotonic()
    cluster = None if config["address"] else _start_cluster(config)
    address = cluster.address if cluster is not None else config["address"]
    context = ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    # Ray's own logs are this session's (a joined cluster's may be under any --temp-dir),
    # not /tmp/ray/session_latest, which is whichever session on the host started last.
    session = context.address_info.get("session_dir")
    config["ray_logs"] = str(Path(session) / "logs") if session else None
    cluster_s = time.monotonic() - began
    log.info("cluster up at %s in %.1f s", address, cluster_s)
    short = gpus_short(float(config.get("replica_gpus") or 0), ray.cluster_resources())
    if short:  # Serve would wait for them without end; say so and go
        log.error("%s (the cluster at %s)", short, address)
        if cluster is None:
            return 1
        _end_descendants(3.0)
        logging.shutdown()
        os._exit(1)
    serve.start(
        proxy_location="HeadOnly",
        http_options={"host": config["host"], "port": config["port"]},
    )
    # A cluster whose Serve already runs keeps its proxy: its address, not --port, is where
    # this run's application answers (Serve says it ignores the new http_options).
    from ray.serve.context import _get_global_client

    http = _get_global_client().http_config
    url = f"http://{'127.0.0.1' if http.host in ('0.0.0.0', '::') else http.host}:{http.port}"
    app = app_name(run_dir)
    head = HEAD_RESOURCE if cluster is not None else None
    # On a cluster shared with other runs, each run's application has a path of its own
    # on the one proxy (Serve routes one application per prefix): /<app>/v2/...
    route = "/" if cluster is not None else f"/{app}"
    url = url if route == "/" else url + route
    deployed = time.monotonic()
    on_stop()  # before deploying: ray.init installed its own SIGTERM handler, which only dies
    serve._run(build(config, head), name=app, route_prefix=route, _blocking=False)
    why = wait_running(app, stop)
    if why is not None:  # nothing of this run may stay on the cluster, nor be left running
        log.error("%s was not deployed: %s", app, why)
        if cluster is None:  # someone else's cluster: remove what this run put there
            serve.delete(app)
            log.info("removed %s from the cluster at %s", app, address)
            return 0 if stop else 1
        _end_descendants(3.0)
        logging.shutdown()
        os._exit(0 if stop else 1)
    # Cold start, in parts (docs/ray.md): the nodes up and joined, Serve's controller and
    # proxy, the application's replicas loaded and warmed up.
    timings = {
        "cluster_s": round(cluster_s, 2),
        "serve_s": round(deployed - began - cluster_s, 2),
        "replicas_s": round(time.monotonic() - deployed, 2),
    }
    (run_dir / "ray_timings.json").write_text(json.dumps(timings))
    write_state(run_dir, config, cluster, app, url)
    log.info(
        "serving %s as %s in %.1f s",
        [m["name"] for m in config["models"]],
        app,
        time.monotonic() - began,
    )
    (run_dir / "ray.ready").write_text(str(time.time()))
    # The replicas move (a node lost, a replica replaced, autoscaling): kept current for
    # loadtest's memory and node kill, which read the file rather than join the cluster.
    # In a thread: a call to a GCS that is going away blocks in Ray's C++ for seconds, and
    # this thread must stay free to take SIGTERM.
    threading.Thread(
        target=_refresh, args=(run_dir, config, cluster, app, url), daemon=True
    ).start()
    while not stop:
        time.sleep(0.2)
    log.info("stopping")
    if cluster is None:  # someone else's cluster: remove this run's application only
        serve.delete(app)
        return 0
    _end_descendants(3.0)
    log.info("stopped: every process of the local cluster ended")
    # Ray's exit hooks would ask the GCS, gone by now, to shut down: skip them.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
