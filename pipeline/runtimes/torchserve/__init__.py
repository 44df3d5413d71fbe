"""TorchServe as a runtime: `.mar` archives behind the authenticating gateway.

Registered once with pipeline.serving.runtime. This module stays light
(`pipeline --help` reads the options from it without loading torch): every
hook imports what it needs when called. Its parts: archive.py (the `.mar`
stage), launch.py (start, private servers), gateway.py (the public port),
workers.py / workerwatch.py (READY workers, scaling, replacement),
bodies.py, codec.py (its request bodies), parity.py (verify), bench.py.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core import argtypes
from pipeline.runtimes.torchserve.constants import (
    CONFIG_PROPERTIES,
    GATEWAY_CONFIG,
    NAME,
)
from pipeline.serving import runtime, shadowopts
from pipeline.serving.capabilities import (
    DEFAULT_PRIVATE,
    BenchReport,
    Commands,
    Packaging,
    PrivateSettings,
    Shadow,
    Versions,
)
from pipeline_runtime.responses import DEFAULT_MAX_RESPONSE

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel
    from pipeline.serving.live import LiveState
    from pipeline.serving.protocol import Protocol
    from pipeline.serving.runtime import BenchSettings, ServeOptions
    from pipeline.serving.server import Server


__all__ = ["CONFIG_PROPERTIES", "GATEWAY_CONFIG", "NAME", "RUNTIME", "TorchServe"]


class _Versions(Versions):
    def live_state(self, server: Server) -> LiveState | None:
        from pipeline.runtimes.torchserve.liveops import live_state

        return live_state(server)

    def apply_live(self, server: Server, state: LiveState, timeout_s: float) -> None:
        from pipeline.runtimes.torchserve.liveops import apply_live

        apply_live(server, state, timeout_s)


class _BenchReport(BenchReport):
    def targets(self, cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
        from pipeline.runtimes.torchserve.bench import targets

        return targets(cells, served)

    def split(self, metrics: str) -> dict[tuple[str, str], tuple[float, float]]:
        from pipeline.runtimes.torchserve.bench import read_split

        return read_split(metrics)


class _Packaging(Packaging):
    model_format = "pytorch"

    def layout_files(self, name: str, *, envelope: bool = False) -> dict[str, str]:
        from pipeline.runtimes.torchserve import properties

        conf = properties.text(properties.on_kserve(name, envelope=envelope))
        return {"config/config.properties": conf}

    def package(self, model: str, export_dir: Path, fmt: str, dest: Path) -> Path:
        from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive

        # batch size 1: TorchServe 0.12's kservev2 envelope answers only the first
        # request of a batch (pytorch/serve#2158).
        (mar,) = archive(
            ArchiveConfig(
                model=model,
                export_dir=export_dir,
                store=dest,
                formats=(fmt,),
                batch_size=1,
                bench_results=None,
            )
        )
        return mar


class _Commands(Commands):
    def add(self, sub: argparse._SubParsersAction, formats: list[str]) -> None:
        from pipeline.runtimes.torchserve.cli import add_archive_command

        add_archive_command(sub, formats)


class TorchServe(runtime.Runtime):
    name = NAME
    title = "TorchServe"
    markers = (CONFIG_PROPERTIES, GATEWAY_CONFIG)
    replaces_workers = True
    # TorchServe mints its keys at every start (they expire after token_expiration_min), so
    # they end with the server: constants.KEY_FILE and server.INFERENCE_KEY_FILE.
    removed_on_stop = ("key_file.json", "inference_key.json")
    description = "the .mar archives in --store, behind the authenticating gateway"
    versions = _Versions()  # --live-versions: register and drop archives while serving
    shadow = Shadow()
    bench_report = _BenchReport()
    packaging = _Packaging()  # KServe's kserve-torchserve ServingRuntime runs its .mar
    commands = _Commands()  # `pipeline archive`

    def add_serve_options(self, group: argparse._ArgumentGroup, formats: list[str]) -> None:
        group.add_argument(
            "--models",
            nargs="+",
            metavar="NAME",
            help="what to serve: archive names (digits_lenet_onnx) or models (digits_lenet: its "
            "one format, as by default); default: one format of every model in the store",
        )
        group.add_argument(
            "--all-formats",
            action="store_true",
            help="serve every archived format of every model (default: one per model, the "
            "fastest verified backend `pipeline bench` measured, else the first held in "
            "registry order, TorchScript first unless this torch refuses torch.jit; each format "
            "costs workers and memory)",
        )
        group.add_argument(
            "--keep-going",
            action="store_true",
            help="serve the models that load even if others fail (default: any failure stops "
            "the start)",
        )
        group.add_argument(
            "--management-port", type=argtypes.port, default=8081, help="default: 8081"
        )
        group.add_argument("--metrics-port", type=argtypes.port, default=8082, help="default: 8082")
        group.add_argument(
            "--workers-per-model",
            type=argtypes.positive_int,
            help="default: physical cores / models served, at least 1",
        )
        group.add_argument(
            "--gpu", action="store_true", help="give workers a GPU when CUDA is present"
        )
        group.add_argument(
            "--max-response-size",
            type=argtypes.positive_int,
            default=DEFAULT_MAX_RESPONSE,
            help="bytes a worker may answer one request with (TorchServe's max_response_size; "
            "default: 16 MiB); a larger answer is its request's 500, naming its size",
        )
        shadowopts.add_arguments(group)  # --shadow, --shadow-max-rate
        group.add_argument(
            "--live-versions",
            action="store_true",
            help="let `pipeline rollout` register published versions while serving: turns "
            "TorchServe's model API on (loopback, the management key, archives from --store "
            "only; default: off, register and delete answer 405)",
        )

    def serve(self, options: ServeOptions) -> Server:
        from pipeline.runtimes.torchserve.launch import ServeConfig, start
        from pipeline.runtimes.torchserve.shadow import ShadowConfig

        own = options.own
        models = [*(own.models or []), *options.models] or None
        shadowopts.check_rates(own.shadow, own.shadow_max_rate)
        shadow = (
            ShadowConfig(own.shadow, own.shadow_max_rate, options.export_dir_of)
            if own.shadow > 0
            else None
        )
        return start(
            ServeConfig(
                store=options.store,
                run_dir=options.run_dir,
                models=models,
                host=options.host,
                inference_port=options.port,
                management_port=own.management_port,
                metrics_port=own.metrics_port,
                threads_per_worker=options.threads_per_worker,
                workers_per_model=own.workers_per_model,
                max_request_size=options.max_request_size,
                max_response_size=own.max_response_size,
                gpu=own.gpu,
                tls_cert=options.tls_cert,
                tls_key=options.tls_key,
                keep_going=own.keep_going,
                one_format=not own.all_formats,
                live_versions=own.live_versions,
                shadow=shadow,
            )
        )

    def describe(self, server: Server) -> list[str]:
        from pipeline.runtimes.torchserve.launch import describe

        return describe(server)

    @contextlib.contextmanager
    def private(
        self, exported: ExportedModel, fmt: str, settings: PrivateSettings = DEFAULT_PRIVATE
    ) -> Iterator[Server]:
        from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
        from pipeline.runtimes.torchserve.launch import private_config, start
        from pipeline.serving.launcher import stop

        with tempfile.TemporaryDirectory(prefix="torchserve-") as tmp:
            store, run_dir = Path(tmp) / "store", Path(tmp) / "run"
            archive(
                ArchiveConfig(
                    model=exported.manifest.model.name,
                    export_dir=exported.dir,
                    store=store,
                    formats=(fmt,),
                ),
                exported.manifest,
            )
            # TorchServe has no tuning of its own (tuned_in): bench measured nothing for it.
            own: dict[str, Any] = {
                "workers_per_model": settings.workers,
                "threads_per_worker": settings.threads,
            }
            if settings.shadow_rate > 0:  # bench's shadow rows (footprint.shadow_cost)
                from pipeline.runtimes.torchserve.shadow import ShadowConfig

                own["shadow"] = ShadowConfig(
                    settings.shadow_rate, shadowopts.DEFAULT_MAX_RATE, lambda _model: exported.dir
                )
            server = start(private_config(store, run_dir, **own))
            try:
                yield server
            finally:
                stop(run_dir)

    @property
    def protocol(self) -> Protocol:
        from pipeline.runtimes.torchserve.protocol import PROTOCOL

        return PROTOCOL

    def worker_pids(self, server: Server, name: str) -> list[int]:
        from pipeline.runtimes.torchserve.workers import ready_pids

        return ready_pids(server, name)

    def fix_command(
        self, model: str, server: Server | None = None, export_dir: Path | None = None
    ) -> str:
        from pipeline.core import paths
        from pipeline.serving.server import restart_command

        archive = f"archive --model {model}"
        # The export the stale check read, where it is not the default one (./artifacts:
        # the CLI's own --artifacts-dir is not the shell's where the hint is run).
        default = paths.export_dir(model, paths.DEFAULT_ARTIFACTS)
        if export_dir and Path(export_dir).is_dir() and Path(export_dir) != default:
            archive += f" --export-dir {shlex.quote(str(export_dir))}"
        return restart_command(server, "pipeline stop && pipeline serve", before=archive)

    def bench(
        self, model: str, exported: ExportedModel, settings: BenchSettings
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        from pipeline.runtimes.torchserve.bench import bench_served

        return bench_served(model, exported, settings)


RUNTIME = runtime.register(TorchServe())
