"""The Ray Serve runtime: the exports served by Ray Serve deployments on a Ray cluster,
over the Open Inference Protocol (`pipeline serve --runtime ray`).

Without `--ray-address` a run starts its own cluster on 127.0.0.1 (a head, and with
`--ray-nodes N` N worker nodes, every listener on loopback) and `pipeline stop` ends it;
with an address it joins that cluster and stop removes only the run's application. The
application is one OIP ingress (REST: token, body limit and error shapes of the shared
guard) in front of one deployment per model, its replicas spread over the nodes
(app.py); host.py is the runtime's own process. A worker node can be lost under load
(`loadtest --kill-node-after`, the `nodes` capability).

Registered once with pipeline.serving.runtime. This module stays light: Ray is imported
only inside the runtime's own process and in the hooks that need it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pipeline.core import argtypes
from pipeline.runtimes.ray.constants import CONFIG_FILE, NAME, TITLE
from pipeline.serving import runtime
from pipeline.serving.capabilities import (
    DEFAULT_PRIVATE,
    Deploy,
    Nodes,
    PrivateSettings,
    refuse_shadow,
)

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel
    from pipeline.serving.protocol import Protocol
    from pipeline.serving.runtime import BenchSettings, ServeOptions
    from pipeline.serving.server import Server

__all__ = ["NAME", "RayServe"]


class _Nodes(Nodes):
    more_nodes = (
        "serve with `pipeline serve --runtime ray --ray-nodes 2 --ray-replicas 2` (or more) "
        "and run loadtest against it"
    )
    # loadtest has no --ray-nodes: its private server is a head-only cluster.
    private_kill_refused = (
        "the private server is a Ray cluster without worker nodes, so there is none to lose; "
        "start `pipeline serve --runtime ray --ray-nodes 2 --ray-replicas 2` and run "
        "`pipeline loadtest --kill-node-after N` (without --serve) against it"
    )

    def serving(self, server: Server, name: str) -> list[str]:
        from pipeline.runtimes.ray.status import replicas_now

        return sorted({r["node_id"] for r in replicas_now(server, name)})

    @staticmethod
    def _workers(known: dict[str, Any], name: str) -> list[dict[str, Any]]:
        from pipeline.runtimes.ray.status import node_alive

        serving = {r["node_id"] for r in known["replicas"].get(name, [])}
        return [
            n for n in known["nodes"] if not n["head"] and n["node_id"] in serving and node_alive(n)
        ]

    def worker_nodes(self, server: Server, name: str) -> list[str]:
        from pipeline.runtimes.ray.status import read

        return [str(n["node_id"]) for n in self._workers(read(server), name)]

    def kill_node(self, server: Server, name: str) -> str:
        import psutil

        from pipeline.runtimes.ray.status import read

        known = read(server)
        if not known.get("owns_cluster"):
            raise ValueError(
                f"{TITLE} did not start the cluster it serves on ({known.get('address')}): "
                "it kills no node of someone else's cluster"
            )
        # Checked again at the kill, not only before the run: a node may have gone since.
        self.refuse_kill(server, name)
        nodes = self._workers(known, name)
        node = nodes[0]
        # A lost machine: every process of the node at once, its raylet's workers too.
        procs = []
        for pids in node["pids"].values():
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(pid)
                    procs += [proc, *proc.children(recursive=True)]
        for proc in procs:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        return str(node["node_id"])


@functools.cache
def _protocol() -> Protocol:
    # The Open Inference Protocol over REST, JSON and the binary extension (app.py reads
    # both). gRPC: Ray Serve's gRPC proxy routes by an `application` metadata key that
    # tritonclient and kserve's client do not send (docs/ray.md).
    from pipeline.serving.openinference import OpenInference

    return OpenInference(transports=("rest",))


class _Deploy(Deploy):
    def add_command(self, sub: argparse._SubParsersAction) -> None:
        from pipeline.runtimes.ray.cli import add_deploy_target

        add_deploy_target(sub)


class RayServe(runtime.Runtime):
    name = NAME
    title = TITLE
    markers = (CONFIG_FILE,)
    nodes = _Nodes()
    deploy = _Deploy()  # `pipeline deploy ray`: a KubeRay RayService
    description = (
        "Ray Serve deployments on a Ray cluster (a local one on 127.0.0.1, or --ray-address), "
        "the Open Inference Protocol over REST with the same token and body limit"
    )
    refuses = MappingProxyType(
        {
            "tls_cert": "Ray Serve's HTTP proxy serves plain HTTP (terminate TLS in front of it)",
            "tls_key": "Ray Serve's HTTP proxy serves plain HTTP (terminate TLS in front of it)",
        }
    )

    def add_serve_options(self, group: argparse._ArgumentGroup, formats: list[str]) -> None:
        group.add_argument(
            "--ray-export-dir",
            action="append",
            type=Path,
            metavar="DIR",
            help="serve this export folder (repeatable; default: --model's)",
        )
        group.add_argument(
            "--ray-format",
            choices=formats,
            help="the artifact to serve from each export (default: bench's "
            "fastest verified format, else the first in registry order)",
        )
        group.add_argument(
            "--ray-address",
            default=os.environ.get("RAY_ADDRESS") or None,
            help="join this running Ray cluster (host:port of its GCS; default: $RAY_ADDRESS, "
            "else start a local cluster on 127.0.0.1 for the run, which `pipeline stop` ends)",
        )
        group.add_argument(
            "--ray-nodes",
            type=int,
            default=0,
            metavar="N",
            help="worker nodes of the local cluster, each its own raylet "
            "(default: 0, the head alone serves)",
        )
        group.add_argument(
            "--ray-node-cpus",
            type=int,
            metavar="N",
            help="CPUs each local node offers (default: 1 per worker node; "
            "without worker nodes, the machine's cores)",
        )
        group.add_argument(
            "--ray-replicas",
            type=int,
            default=1,
            metavar="N",
            help="replicas of each model (default: 1), one CPU each",
        )
        group.add_argument(
            "--ray-min-replicas",
            type=int,
            metavar="N",
            help="autoscale each model from N replicas (with --ray-max-replicas)",
        )
        group.add_argument(
            "--ray-max-replicas",
            type=int,
            metavar="N",
            help="autoscale each model up to N replicas",
        )
        group.add_argument(
            "--ray-replica-cpus",
            type=float,
            metavar="N",
            help="CPUs each replica reserves (default: 1, shared evenly when the local "
            "cluster has fewer; 0 reserves none, for a joined cluster whose CPUs are taken)",
        )
        group.add_argument(
            "--ray-replica-gpus",
            type=float,
            default=0.0,
            metavar="N",
            help="GPUs each replica reserves, and runs its model on (default: 0, CPU; "
            "a fraction shares one GPU between replicas)",
        )
        group.add_argument(
            "--ray-max-batch-size",
            type=argtypes.positive_int,
            default=8,
            metavar="N",
            help="requests one forward pass takes at most (serve.batch; default: 8)",
        )
        group.add_argument(
            "--ray-batch-wait-ms",
            type=argtypes.non_negative_float,
            default=0.0,
            metavar="MS",
            help="how long a batch waits for more requests (default: 0)",
        )

    def serve(self, options: ServeOptions) -> Server:
        from pipeline.core.defaults import DEFAULT_MODEL
        from pipeline.runtimes.ray.launch import start
        from pipeline.serving.server import ServeError

        own = options.own
        dirs = list(own.ray_export_dir or [])
        dirs += [options.export_dir_of(m) for m in options.models]
        dirs = dirs or [options.export_dir_of(DEFAULT_MODEL)]
        config = self._config(own, options.threads_per_worker, ServeError)
        if config.replica_gpus and not config.address:  # the local cluster has this machine's
            import torch

            from pipeline.runtimes.ray.host import gpus_short

            short = gpus_short(config.replica_gpus, {"GPU": torch.cuda.device_count()})
            if short:
                raise ServeError(short + ".")
        config.host, config.port = options.host, options.port
        config.max_request_size = options.max_request_size
        from pipeline.runtimes.ray.launch import served_model

        infos = {}
        for d in dirs:
            model, info = served_model(d, own.ray_format)
            config.models.append(model)
            infos[model["name"]] = info
        return start(config, options.run_dir, infos)

    @staticmethod
    def _config(own: argparse.Namespace, threads: int | None, error: type[Exception]) -> Any:
        from pipeline.runtimes.ray.launch import RayConfig

        least = {"--ray-nodes": 0, "--ray-replicas": 1, "--ray-max-batch-size": 1}
        got = dict(
            zip(least, (own.ray_nodes, own.ray_replicas, own.ray_max_batch_size), strict=True)
        )
        wrong = [
            f"{k} must be {'0 or more' if least[k] == 0 else 'at least 1'}; got {v}"
            for k, v in got.items()
            if v < least[k]
        ]
        if wrong:  # only the option that is wrong, with what it got
            raise error("; ".join(wrong) + ".")
        if own.ray_replica_cpus is not None and own.ray_replica_cpus < 0:
            raise error(f"--ray-replica-cpus must be 0 or more; got {own.ray_replica_cpus}.")
        if own.ray_replica_gpus < 0:
            raise error(f"--ray-replica-gpus must be 0 or more; got {own.ray_replica_gpus}.")
        if own.ray_address and own.ray_nodes:
            raise error(
                "--ray-nodes starts worker nodes of a local cluster; with "
                "--ray-address the cluster's own nodes serve."
            )
        autoscaling = {}
        if own.ray_min_replicas is not None or own.ray_max_replicas is not None:
            low = own.ray_min_replicas if own.ray_min_replicas is not None else 1
            high = own.ray_max_replicas if own.ray_max_replicas is not None else max(low, 1)
            if not 0 <= low <= high or high < 1:
                raise error(
                    f"Autoscaling needs 0 <= --ray-min-replicas <= --ray-max-replicas "
                    f"and a maximum of at least 1; got {low} and {high}."
                )
            autoscaling = {
                "min_replicas": low,
                "max_replicas": high,
                "initial_replicas": max(low, 1),
            }
        cpus = own.ray_node_cpus or (1 if own.ray_nodes else max(1, os.cpu_count() or 1))
        return RayConfig(
            models=[],
            address=own.ray_address,
            worker_nodes=own.ray_nodes,
            node_cpus=cpus,
            replicas=own.ray_replicas,
            autoscaling=autoscaling,
            # Spread over worker nodes: one replica of a model per node, so a node's loss
            # takes one replica, not all of them.
            max_replicas_per_node=1 if own.ray_nodes >= max(own.ray_replicas, 2) else None,
            threads=threads or 1,
            max_batch_size=own.ray_max_batch_size,
            batch_wait_ms=own.ray_batch_wait_ms,
            replica_cpus_asked=own.ray_replica_cpus,
            replica_gpus=own.ray_replica_gpus,
        )

    def describe(self, server: Server) -> list[str]:
        from pipeline.serving.server import INFERENCE_KEY_FILE, run_dir_flag

        run_dir = Path(server.run_dir)
        lines = [
            f"Ray Serve is up (pid {server.pid}), serving: {', '.join(server.models)}",
            f"  cluster: {server.extras.get('cluster', '')}",
            f"  REST:    {server.inference_url}/v2/models/<model>/infer",
            f"  token:   {run_dir / INFERENCE_KEY_FILE} (send 'Authorization: Bearer <its "
            "inference key>')",
            f"  logs:    {run_dir / 'logs'} (Ray's own: "
            f"{server.extras.get('ray_logs') or '/tmp/ray/session_latest/logs'})",
            f"stop it with `pipeline stop{run_dir_flag(run_dir)}`",
        ]
        if server.extras.get("asked"):
            lines.insert(
                3,
                f"  note:    the cluster's Serve proxy was already running; this run "
                f"answers there, not on {server.extras['asked']}",
            )
        return lines

    @contextlib.contextmanager
    def private(
        self, exported: ExportedModel, fmt: str, settings: PrivateSettings = DEFAULT_PRIVATE
    ) -> Iterator[Server]:
        from pipeline.runtimes.ray.launch import private

        refuse_shadow(self.title, settings)
        own: dict[str, Any] = {}
        if settings.workers is not None:
            own["replicas"] = settings.workers
        if settings.threads is not None:
            own["threads"] = settings.threads
        with private([(exported.dir, fmt)], None, exported.manifest, **own) as server:
            yield server

    @property
    def protocol(self) -> Protocol:
        return _protocol()

    def worker_pids(self, server: Server, name: str) -> list[int]:
        if not server.alive():
            return []
        from pipeline.runtimes.ray.status import replicas_now

        return sorted(r["pid"] for r in replicas_now(server, name))

    def fix_command(
        self, model: str, server: Server | None = None, export_dir: Path | None = None
    ) -> str:
        from pipeline.core.defaults import DEFAULT_MODEL
        from pipeline.serving.server import option_values, restart_command, serve_options

        fallback = f"pipeline stop && pipeline serve --runtime ray --model {model}"
        if server is None or "serve" not in server.command:
            return restart_command(server, fallback)
        options = serve_options(server)
        models = option_values(options, "--model")
        adding: list[str] = []
        # Without --model or --ray-export-dir it served the default model: keep serving it.
        if not models and not option_values(options, "--ray-export-dir"):
            models = [DEFAULT_MODEL]
            adding += ["--model", DEFAULT_MODEL] if model != DEFAULT_MODEL else []
        # The model asked for, beside what it serves (by name, or from an export folder).
        if model not in models and model not in {i.model for i in server.served.values()}:
            adding += ["--model", model]
        # A cluster joined through $RAY_ADDRESS is not on the recorded command line: a
        # fresh shell without it would start a local cluster instead (the host's state
        # file says which cluster it joined).
        from pipeline.runtimes.ray.status import read

        known = read(server)
        joined = known.get("address") if known.get("owns_cluster") is False else None
        if joined and not option_values(options, "--ray-address"):
            adding += ["--ray-address", str(joined)]
        return restart_command(server, fallback, adding=adding)

    def bench(
        self, model: str, exported: ExportedModel, settings: BenchSettings
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        from pipeline.runtimes.ray.bench import bench_ray

        return bench_ray(model, exported, settings)


RUNTIME = runtime.register(RayServe())
