"""Runtimes written only in tests/: the proof that the runtime contract is the seam.

Two register through `pipeline.serving.runtime.register` like the built-in ones, without
a change under pipeline/. `Bare` ("bare") implements the core alone, the eight methods
every runtime must, and goes through `pipeline serve`, `infer`, `verify`, `loadtest`
and `bench`; `pipeline rollout` refuses it. `Toy` ("toy") is the same server with the
versions capability, which rollout, status and rollback drive. Their server (server.py)
is a small Open Inference Protocol server (JSON only) on aiohttp, run as a process of
its own, like a real runtime's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx

from pipeline.core import fileio
from pipeline.core import paths as core_paths
from pipeline.core.defaults import DEFAULT_MODEL
from pipeline.export.opened import ExportedModel
from pipeline.serving import launcher, live, runtime, served, versions
from pipeline.serving.capabilities import (
    DEFAULT_PRIVATE,
    PrivateSettings,
    Versions,
    refuse_shadow,
)
from pipeline.serving.openinference import OpenInference
from pipeline.serving.protocol import Protocol
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.runtime import BenchSettings, ServeOptions
from pipeline.serving.server import INFERENCE_KEY_FILE, Server
from pipeline_runtime.manifest import Manifest

NAME, BARE = "toy", "bare"
CONFIG_FILE = "toy.json"
# The shared Open Inference Protocol (routes, bodies, request files); the toy's server
# reads OIP JSON only, so loadtest offers no binary encoding for it.
PROTOCOL = OpenInference(encodings=("json",))


def start(
    exports: list[tuple[Path, Manifest, str]],
    run_dir: Path,
    port: int,
    names: list[str] | None = None,
    *,
    host: str = "127.0.0.1",
    max_request_size: int = 4 * 1024 * 1024,
    threads: int | None = None,
    runtime_name: str = NAME,
) -> Server:
    """Serve each (export folder, its manifest, format) as an OIP model named after its
    model, or `names[i]` (bench serves every format of one model side by side), as the
    runtime `runtime_name` (its config file, the marker, is `<runtime_name>.json`)."""
    run_dir = launcher.prepare(
        launcher.Launch(title=f"the {runtime_name} runtime", run_dir=run_dir, host=host,
                        ports=[(host, port, "--port")])
    )  # fmt: skip
    token = fileio.write_secret(
        run_dir / INFERENCE_KEY_FILE, {"inference": {"key": secrets.token_urlsafe(16)}}
    )
    models, archives = [], {}
    for i, (export_dir, manifest, fmt) in enumerate(exports):
        name = names[i] if names else core_paths.model_slug(manifest.model.name)
        models.append({"name": name, "export_dir": str(Path(export_dir).resolve()),
                       "format": fmt, "version": versions.number_of(export_dir)})  # fmt: skip
        why = served.why_served(manifest, fmt, served.fastest_entry(manifest.model.name, None))
        archives[name] = ServedInfo.of(manifest, fmt, why=why)
    conf = run_dir / f"{runtime_name}.json"
    live.clear(run_dir)  # a new start serves what it was given, not the last run's rollout
    conf.write_text(
        json.dumps(
            {"host": host, "port": port, "max_request_size": max_request_size,
             "threads": threads, "token_file": str(token), "models": models}
        )
    )  # fmt: skip
    argv = [sys.executable, "-m", "tests.toy_runtime.server", str(conf)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = launcher.spawn(argv, run_dir, f"{runtime_name}.out", env)
    url = f"http://{host}:{port}"
    server = Server(
        runtime=runtime_name, pid=proc.pid, run_dir=str(run_dir), inference_url=url, metrics_url=url,
        models=[m["name"] for m in models], started=launcher.created(proc.pid),
        markers=[conf.name], served=archives,
    )  # fmt: skip
    server.record()

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    with launcher.stopped_on_failure(run_dir):
        launcher.wait_until(
            ready,
            proc,
            run_dir / "logs" / f"{runtime_name}.out",
            120,
            f"The {runtime_name} runtime",
        )
    return server


class Bare(runtime.Runtime):
    """The core alone: no versions, shadow check, bench report, deploy or packaging."""

    name = BARE
    title = "the bare runtime"
    markers = ("bare.json",)
    description = "a test's Open Inference Protocol server (JSON only), the core alone"

    def add_serve_options(self, group: argparse._ArgumentGroup, formats: list[str]) -> None:
        group.add_argument(f"--{self.name}-format", choices=formats, help="the artifact to serve")

    # Its server speaks plain HTTP: given --tls-cert, `pipeline serve` says so instead of
    # starting a server that would ignore it.
    refuses = MappingProxyType(
        {"tls_cert": "it serves plain HTTP only", "tls_key": "it serves plain HTTP only"}
    )

    def serve(self, options: ServeOptions) -> Server:
        chosen = getattr(options.own, f"{self.name}_format")
        exports = [
            (e.dir, e.manifest, chosen or served.export_format(e.manifest))
            for e in options.exports(DEFAULT_MODEL)
        ]
        return start(
            exports, options.run_dir, options.port, host=options.host,
            max_request_size=options.max_request_size, threads=options.threads_per_worker,
            runtime_name=self.name,
        )  # fmt: skip

    def describe(self, server: Server) -> list[str]:
        return [f"{self.title} is up (pid {server.pid}) on {server.inference_url}"]

    @contextlib.contextmanager
    def private(
        self, exported: ExportedModel, fmt: str, settings: PrivateSettings = DEFAULT_PRIVATE
    ) -> Iterator[Server]:
        refuse_shadow(self.title, settings)
        with _private([(exported.dir, exported.manifest, fmt)], name=self.name) as server:
            yield server

    @property
    def protocol(self) -> Protocol:
        return PROTOCOL

    def worker_pids(self, server: Server, name: str) -> list[int]:
        return [server.pid] if server.alive() else []

    def fix_command(
        self, model: str, server: Server | None = None, export_dir: Path | None = None
    ) -> str:
        return f"pipeline stop && pipeline serve --runtime {self.name} --model {model}"

    def bench(
        self, model: str, exported: ExportedModel, settings: BenchSettings
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        from pipeline.bench.load import every_level, first_answers, sequential, sequential_point

        inputs = exported.sample(1, seed=0)
        body, expected = PROTOCOL.encode(inputs), exported.eager(inputs)
        skipped: list[dict[str, Any]] = []
        formats = settings.served_formats(exported)
        if not formats:
            return [], skipped

        def backend(fmt: str) -> str:
            return f"{self.name}/{fmt}"

        # Every format of the model from one server, as the KServe runtime's bench serves
        # them (one start, not one per format), each under a name of its own.
        slug = core_paths.model_slug(model)
        names = {fmt: f"{slug}_{fmt}" for fmt in formats}
        exports = [(exported.dir, exported.manifest, fmt) for fmt in formats]
        with _private(exports, list(names.values()), name=self.name) as server:
            first = first_answers(
                server, names, body, expected, skipped, model=model, backend=backend
            )

            def at_one(order: list[str]) -> list[Any]:
                paths = {f: (server, names[f]) for f in order}
                got = sequential(paths, body, settings.requests_per_level, settings.level_budget_s)
                return [
                    sequential_point(lat, failed, backend=backend(f), model=model,
                                     batching="on", first_request_ms=first[f])
                    for f, (lat, failed) in got.items()
                ]  # fmt: skip

            points = every_level(
                server, names, [f for f in names if f in first], body, settings,
                at_one=at_one, backend=backend, model=model, batching="on",
            )  # fmt: skip
        return points, skipped


class _Versions(Versions):
    """The run folder's live state, which the server's one process watches (server.py)."""

    def live_state(self, server: Server) -> live.LiveState:
        state = live.read(Path(server.run_dir))
        if state is not None:
            return state
        config = json.loads((Path(server.run_dir) / CONFIG_FILE).read_text())
        models = {}
        for m in config["models"]:
            number = m["version"] or 1
            where = live.Loaded(number, m["export_dir"], m["format"])
            models[m["name"]] = live.ModelVersions({number: where}, number)
        return live.LiveState(0, models)

    def apply_live(self, server: Server, state: live.LiveState, timeout_s: float) -> None:
        live.write(Path(server.run_dir), state)
        live.wait_applied(Path(server.run_dir), state.generation, 1, timeout_s)


class Toy(Bare):
    """The same server, with versions on it."""

    name = NAME
    title = "the toy runtime"
    markers = (CONFIG_FILE,)
    description = "a test's Open Inference Protocol server (JSON only), with versions"
    versions = _Versions()


@contextlib.contextmanager
def _private(
    exports: list[tuple[Path, Manifest, str]], names: list[str] | None = None, *, name: str
) -> Iterator[Server]:
    """A server of its own in a temporary folder, stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        run_dir = Path(tmp) / "run"
        server = start(exports, run_dir, launcher.free_port(), names, runtime_name=name)
        try:
            yield server
        finally:
            launcher.stop(run_dir)


RUNTIME, BARE_RUNTIME = Toy(), Bare()


def register(rt: runtime.Runtime = RUNTIME) -> runtime.Runtime:
    return runtime.register(rt)


@contextlib.contextmanager
def registered(rt: runtime.Runtime = RUNTIME) -> Iterator[runtime.Runtime]:
    """`rt` (the toy, by default) registered for the block, unregistered after."""
    register(rt)
    try:
        yield rt
    finally:
        runtime.unregister(rt.name)
