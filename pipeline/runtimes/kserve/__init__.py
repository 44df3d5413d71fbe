"""The KServe runtime: KServe's Python model server speaking the Open Inference
Protocol over the exports themselves (`pipeline serve --runtime kserve`), and
what a Kubernetes cluster needs to run it (`pipeline deploy kserve`).

Registered once with pipeline.serving.runtime. `kserve` is imported only
inside the runtime's own process: importing it parses `sys.argv` (kserve
0.21.0), which would break any other command line. This module stays light
(`pipeline --help` reads the options from it): every hook imports what it
needs when called.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core import argtypes
from pipeline.runtimes.kserve.constants import (
    CONFIG_FILE,
    DEFAULT_GRPC_PORT,
    METRICS_KEY_FILE,
    NAME,
)
from pipeline.serving import runtime, shadowopts
from pipeline.serving.capabilities import (
    DEFAULT_PRIVATE,
    BenchReport,
    Deploy,
    PrivateSettings,
    Shadow,
    Versions,
)

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel
    from pipeline.serving.live import LiveState
    from pipeline.serving.protocol import Protocol
    from pipeline.serving.runtime import BenchSettings, ServeOptions
    from pipeline.serving.server import Server


__all__ = ["CONFIG_FILE", "DEFAULT_GRPC_PORT", "METRICS_KEY_FILE", "NAME", "KServe"]


class _Versions(Versions):
    def live_state(self, server: Server) -> LiveState | None:
        from pipeline.runtimes.kserve.liveops import live_state

        return live_state(server)

    def apply_live(self, server: Server, state: LiveState, timeout_s: float) -> None:
        from pipeline.runtimes.kserve.liveops import apply_live

        apply_live(server, state, timeout_s)


class _BenchReport(BenchReport):
    def notes(self, out_dir: Path) -> str:
        from pipeline.runtimes.kserve.sweep import markdown

        return markdown(out_dir)

    def targets(self, cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
        from pipeline.runtimes.kserve.bench import targets

        return targets(cells, served)

    def split(self, metrics: str) -> dict[tuple[str, str], tuple[float, float]]:
        from pipeline.runtimes.kserve.bench import read_split

        return read_split(metrics)


class _Deploy(Deploy):
    def add_command(self, sub: argparse._SubParsersAction) -> None:
        from pipeline.runtimes.kserve.cli import add_deploy_target

        add_deploy_target(sub)


class KServe(runtime.Runtime):
    name = NAME
    title = "the KServe runtime"
    markers = (CONFIG_FILE,)
    # The supervisor replaces a killed worker (supervisor.py): loadtest --kill-worker-after.
    replaces_workers = True
    # `pipeline stop` deletes no key file: the inference token outlives a restart, so
    # clients keep working (`--rotate-token` replaces it; tokens.py).
    removed_on_stop = ()
    versions = _Versions()
    shadow = Shadow()
    bench_report = _BenchReport()
    deploy = _Deploy()  # `pipeline deploy kserve`
    description = (
        "KServe's model server over the Open Inference Protocol (REST /v2 and gRPC), one "
        "model per export, the same token, body limit and loopback default"
    )

    def add_serve_options(self, group: argparse._ArgumentGroup, formats: list[str]) -> None:
        group.add_argument(
            "--export-dir",
            action="append",
            type=Path,
            metavar="DIR",
            help="serve this export folder (repeatable; default: the default model's)",
        )
        group.add_argument(
            "--format",
            choices=formats,
            help="the artifact to serve from each export (default: bench's fastest verified "
            "format, else the first in registry order)",
        )
        group.add_argument(
            "--grpc-port",
            type=argtypes.port,
            default=DEFAULT_GRPC_PORT,
            help=f"gRPC port (default: {DEFAULT_GRPC_PORT})",
        )
        group.add_argument(
            "--max-batch-size",
            type=argtypes.positive_int,
            default=8,
            help="queued requests stacked into one forward pass at most (default: 8)",
        )
        group.add_argument(
            "--max-batch-delay-ms",
            type=argtypes.non_negative_float,
            default=0.0,
            help="how long a batch waits for more requests (default: 0, only what is queued)",
        )
        group.add_argument(
            "--workers",
            type=argtypes.positive_int,
            metavar="N",
            help="runtime processes sharing the ports, each with its own models and batcher; "
            "a dead one is replaced (default: the count `pipeline bench` measured best on this "
            "machine, <artifacts>/bench/kserve_workers.json; without one, the cores but one, "
            "1 to 8; each gets cores // N intra-op threads unless --threads-per-worker says)",
        )
        group.add_argument(
            "--device",
            default="auto",
            metavar="{auto,cpu,cuda,cuda:N}",
            help="where the workers run the models (default: auto, a GPU where CUDA is "
            "present; ONNX through ONNX Runtime's CUDA provider where it has one)",
        )
        shadowopts.add_arguments(group)  # --shadow, --shadow-max-rate
        group.add_argument(
            "--rotate-token",
            action="store_true",
            help="write a new inference token (and metrics key, off loopback) even though the "
            "previous start's is still valid; clients must read inference_key.json again "
            "(default: a start keeps the token, and `pipeline stop` leaves it in place)",
        )

    def serve(self, options: ServeOptions) -> Server:
        from pipeline.core import paths
        from pipeline.core.defaults import DEFAULT_MODEL
        from pipeline.core.device import resolve_device
        from pipeline.runtimes.kserve.config import (
            RuntimeConfig,
            default_threads,
        )
        from pipeline.runtimes.kserve.launch import served_export, start
        from pipeline.runtimes.kserve.sweep import choose
        from pipeline.serving.loading import check_device
        from pipeline.serving.server import ServeError

        own = options.own
        dirs = list(own.export_dir or [])
        # A model published in the store is served at its default version (versions.py).
        dirs += [options.export_dir_of(m) for m in options.models]
        dirs = dirs or [options.export_dir_of(DEFAULT_MODEL)]
        models = [served_export(d, own.format) for d in dirs]
        if own.workers is None:
            choice = choose(
                paths.bench_dir(options.artifacts_dir), [m.info.model for m in models if m.info]
            )
            workers, why = choice.workers, choice.why
        else:
            workers, why = own.workers, "--workers"
        if workers < 1:
            raise ServeError(f"--workers must be at least 1, e.g. --workers 2; got {workers}.")
        shadowopts.check_rates(own.shadow, own.shadow_max_rate)
        check_device(own.device)
        if own.device.startswith("cuda"):  # said now, not by every worker's failed start
            resolve_device(own.device)
        config = RuntimeConfig(
            models=models,
            host=options.host,
            http_port=options.port,
            grpc_port=own.grpc_port,
            max_request_size=options.max_request_size,
            tls_cert=str(options.tls_cert) if options.tls_cert else None,
            tls_key=str(options.tls_key) if options.tls_key else None,
            max_batch_size=own.max_batch_size,
            max_batch_delay_ms=own.max_batch_delay_ms,
            threads=options.threads_per_worker or default_threads(workers),
            workers=workers,
            shadow_rate=own.shadow,
            shadow_max_rate=own.shadow_max_rate,
            device=own.device,
        )
        server = start(config, options.run_dir, rotate_token=own.rotate_token)
        server.extras["workers"] = f"{workers} × {config.threads} thread(s) ({why})"
        server.extras["device"] = _device_said(own.device)
        return server

    def describe(self, server: Server) -> list[str]:
        from pipeline.serving.server import INFERENCE_KEY_FILE, run_dir_flag

        run_dir = Path(server.run_dir)
        # What this start did with each key file (launch.write_tokens), never the key.
        said = {
            "kept": "kept from the previous start",
            "new": "new",
            "replaced": "new: the previous file was not fit, see the log",
            "rotated": "new (--rotate-token)",
        }
        token = server.extras.get("token", "")
        metrics_key = server.extras.get("metrics_key", "")
        metrics = (
            f"send the 'metrics' key of {run_dir / METRICS_KEY_FILE}, {said.get(metrics_key, '')}"
            if metrics_key
            else "open to scrapes on loopback, no token"
        )
        lines = [
            f"KServe is up (pid {server.pid}), serving: {', '.join(server.models)}",
            f"  REST:    {server.inference_url}/v2/models/<model>/infer",
            f"  gRPC:    {server.extras['grpc_url']} (inference.GRPCInferenceService)",
            f"  metrics: {server.metrics_url}/metrics ({metrics})",
            f"  token:   {run_dir / INFERENCE_KEY_FILE} ({said.get(token, 'written')}; send "
            "'Authorization: Bearer <its inference key>', also as gRPC metadata)",
            f"  logs:    {run_dir / 'logs'}",
            f"stop it with `pipeline stop{run_dir_flag(run_dir)}` (the token stays for the next "
            "start)",
        ]
        if server.extras.get("workers"):  # set by serve() on the start it returns
            lines.insert(4, f"  workers: {server.extras['workers']}")
            lines.insert(5, f"  device:  {server.extras['device']}")
        changed = [
            str(run_dir / name)
            for name, state in ((INFERENCE_KEY_FILE, token), (METRICS_KEY_FILE, metrics_key))
            if state in ("replaced", "rotated")
        ]
        if changed:
            lines.append(f"the token changed: clients must read {' and '.join(changed)} again")
        return lines

    @contextlib.contextmanager
    def private(
        self, exported: ExportedModel, fmt: str, settings: PrivateSettings = DEFAULT_PRIVATE
    ) -> Iterator[Server]:
        from pipeline.runtimes.kserve.config import default_threads
        from pipeline.runtimes.kserve.launch import private, served_export

        own: dict[str, Any] = {}  # RuntimeConfig's fields; what is not set keeps its default
        if settings.tuned_in is not None and settings.workers is None:  # bench's sweep, as serve
            from pipeline.runtimes.kserve.sweep import choose

            workers = choose(settings.tuned_in, [exported.name]).workers
            own |= {"workers": workers, "threads": default_threads(workers)}
        if settings.workers is not None:
            own["workers"] = settings.workers
        if settings.threads is not None:
            own["threads"] = settings.threads
        if settings.shadow_rate > 0:
            own["shadow_rate"] = settings.shadow_rate
        served = served_export(exported.dir, fmt, manifest=exported.manifest)
        with private([served], **own) as server:
            yield server

    @property
    def protocol(self) -> Protocol:
        from pipeline.serving.openinference import OIP

        return OIP

    def worker_pids(self, server: Server, name: str) -> list[int]:
        # Every worker serves every model; they are the supervisor's (server.pid's) children,
        # counted once ready (its workers/<slot>.ready holds its pid): a replacement exists
        # seconds before it serves, and loadtest's recovery time read 0.2 s for a worker
        # that took 2.3 s to listen.
        import psutil

        from pipeline.runtimes.kserve.supervisor import WORKERS_DIR

        if not server.alive():
            return []
        ready = set()
        for marker in (Path(server.run_dir) / WORKERS_DIR).glob("*.ready"):
            with contextlib.suppress(OSError, ValueError):
                ready.add(int(marker.read_text()))
        live = set()
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(server.pid).children():
                # A killed worker is a zombie until the supervisor reaps it: not serving.
                with contextlib.suppress(psutil.NoSuchProcess):
                    if child.status() != psutil.STATUS_ZOMBIE:
                        live.add(child.pid)
        return sorted(live & ready)

    def fix_command(
        self, model: str, server: Server | None = None, export_dir: Path | None = None
    ) -> str:
        from pipeline.serving.server import restart_command

        return restart_command(
            server, f"pipeline stop && pipeline serve --runtime kserve --model {model}"
        )

    def bench(
        self, model: str, exported: ExportedModel, settings: BenchSettings
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        from pipeline.runtimes.kserve.bench import bench_kserve

        return bench_kserve(model, exported, settings)


RUNTIME = runtime.register(KServe())


def _device_said(device: str) -> str:
    """--device as `serve` prints it: what "auto" comes to on this machine."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "auto: the GPU (the log's line for each model says where it runs)"
    return "auto: CPU (no CUDA here)"
