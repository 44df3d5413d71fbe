"""The runtime contract and its registry.

A runtime is one package under `pipeline/runtimes/` that subclasses `Runtime`
and calls `register()` once, as a format does in `pipeline/formats/`. The core is
what every runtime must do, eight methods: its `pipeline serve` options and start,
what it prints about a started server, a private server of one export (loadtest,
bench, tests), the wire protocol it speaks (pipeline.serving.protocol: routes,
bodies, request files, transports), the processes that answer a model, the command
that fixes a stale server, and its bench driver. Beside them it declares its name
(the `--runtime` choice, the record's `runtime`, the prefix of its verify and bench
backends) and the marker file that identifies its processes. Everything else it
may offer is a capability object (pipeline.serving.capabilities: versions, shadow
checks, bench notes and targets, deploy, packaging), None where it offers none.
verify's served backends are built from the protocol (pipeline.serving.backends),
not by each runtime.

`pipeline serve`, `stop`, `infer`, `verify`, `loadtest`, `bench` and `deploy`
ask the registry; nothing outside a runtime's package compares a runtime's
name (tests/unit/test_layout.py refuses such a comparison).

The built-in runtimes' names are declared in `pipeline/serving/names.py` (`BUILTIN_RUNTIMES`),
so that `pipeline --help` lists them without importing a runtime package;
each package's `__init__` stays light (heavy modules are imported inside its
methods), so the CLI can ask a runtime for its options without loading torch.
Runtimes are imported lazily, by name, from `pipeline.runtimes.<name>`: they
sit after the shared serving layer and bench, which reach them only here.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from pipeline.core.errors import PipelineError
from pipeline.core.paths import DEFAULT_STORE
from pipeline.serving.capabilities import (
    DEFAULT_PRIVATE,
    BenchReport,
    Commands,
    Deploy,
    Nodes,
    Packaging,
    PrivateSettings,
    Shadow,
    Versions,
)
from pipeline.serving.names import BUILTIN, BUILTIN_RUNTIMES, Declared

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel
    from pipeline.serving.protocol import Protocol
    from pipeline.serving.server import Server
    from pipeline_runtime.manifest import Manifest


class RuntimeNameError(PipelineError):
    """An unknown runtime, or options given to a runtime that does not take them."""


# The options every runtime takes (`pipeline serve`'s shared group). A runtime honours each
# or names it in `Runtime.refuses`, and the CLI refuses it then: none is silently dropped.
SHARED_OPTIONS = (
    "host",
    "port",
    "tls_cert",
    "tls_key",
    "max_request_size",
    "threads_per_worker",
    "store",
)
DEFAULT_MAX_REQUEST_SIZE = 4 * 1024 * 1024


@dataclass
class ServeOptions:
    """What `pipeline serve` hands a runtime: the shared options typed, the models asked
    for (and their exports, opened on first use), and the runtime's own options.

    It notes which shared options the runtime read: the contract test
    (tests/integration/test_runtime_contract.py) fails a runtime that starts a server
    without reading one it does not refuse."""

    run_dir: Path
    artifacts_dir: Path | None = None
    models: tuple[str, ...] = ()  # as given to --model; empty: the runtime's default
    host: str = "127.0.0.1"
    port: int = 8080
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE
    threads_per_worker: int | None = None
    # The model store: TorchServe's .mar archives, and the published versions
    # (pipeline.serving.versions) every runtime serves the default of.
    store: Path = DEFAULT_STORE
    # The runtime's own group (`add_serve_options`), by argparse dest.
    own: argparse.Namespace = field(default_factory=argparse.Namespace)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_read", set())
        object.__setattr__(self, "_exports", None)

    def __getattribute__(self, name: str) -> Any:
        if name in SHARED_OPTIONS:
            object.__getattribute__(self, "_read").add(name)
        return object.__getattribute__(self, name)

    def unread(self) -> list[str]:
        """The shared options no one has read yet."""
        read = object.__getattribute__(self, "_read")
        return [o for o in SHARED_OPTIONS if o not in read]

    def given(self) -> list[str]:
        """The shared options set to other than their defaults (without counting as read)."""
        defaults = ServeOptions(run_dir=Path("."))
        return [
            o
            for o in SHARED_OPTIONS
            if object.__getattribute__(self, o) != object.__getattribute__(defaults, o)
        ]

    def manifest_of(self, model: str) -> Manifest:
        """`model`'s export manifest: the one `exports` opened, else read from its folder."""
        for opened in object.__getattribute__(self, "_exports") or ():
            if opened.name == model:
                return opened.manifest
        from pipeline.core.manifest import read_manifest

        return read_manifest(self.export_dir_of(model))

    def exports(self, default: str) -> list[ExportedModel]:
        """The exports of the models asked for (`default` when none was), opened once."""
        if object.__getattribute__(self, "_exports") is None:
            from pipeline.export.opened import open_export

            models = self.models or (default,)
            opened = [open_export(self.export_dir_of(m)) for m in models]
            object.__setattr__(self, "_exports", opened)
        return list(object.__getattribute__(self, "_exports"))

    def export_dir_of(self, model: str) -> Path:
        """The export `model` is served from: the store's default version once the model
        is published there (`pipeline publish`), else the export folder as export wrote it."""
        from pipeline.core import paths, signing
        from pipeline.serving import versions

        published = versions.default(model, self.store)
        if published is None:  # under the store's policy: said that nothing is checked
            folder = paths.export_dir(model, self.artifacts_dir)
            signing.require(folder, store=self.store)
            return folder
        signing.require(published.dir)  # the trust policy, when the store or --trust has one
        return published.dir

    @classmethod
    def from_args(cls, args: argparse.Namespace, run_dir: Path, own: list[str]) -> ServeOptions:
        """`pipeline serve`'s parsed arguments; `own`: the dests of the runtime's group."""
        return cls(
            run_dir=run_dir,
            artifacts_dir=args.artifacts_dir,
            models=tuple(args.serve_models or ()),
            host=args.host,
            port=args.port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            max_request_size=args.max_request_size,
            threads_per_worker=args.threads_per_worker,
            store=args.store,
            own=argparse.Namespace(**{d: getattr(args, d) for d in own}),
        )


@dataclass
class BenchSettings:
    """What bench asks of a runtime's driver for one model (the same for every runtime)."""

    concurrencies: tuple[int, ...] = (1, 8, 32)
    requests_per_level: int = 200
    batching: tuple[str, ...] = ("off", "on")
    level_budget_s: float = 20.0
    # A runtime may first measure its own settings (the KServe runtime: how many worker
    # processes serve best) and keep what it found in `out_dir` for `pipeline serve`.
    tune: bool = False
    out_dir: Path | None = None
    # The formats to serve, of those the export holds (None: every one). bench serves the
    # float32 formats; the int8/float16 ones are compared in-process (its precision table).
    formats: tuple[str, ...] | None = None

    def served_formats(self, exported: ExportedModel) -> list[str]:
        """The keys of the formats to measure, in the export's order (a runtime serves them:
        not the on-device ones)."""
        keys = [f.key for f in exported.formats() if f.served]
        return keys if self.formats is None else [k for k in keys if k in self.formats]


class Runtime(abc.ABC):
    """One serving runtime: the core every runtime implements (eight methods), and the
    capabilities it offers (pipeline.serving.capabilities), each None when it does not.
    A hook that imports a heavy module imports it inside the method."""

    name: str
    title: str
    # The config file in the run folder whose path is on the command line of every process
    # the runtime starts (and of no one else's): how `stop` recognises them.
    markers: tuple[str, ...]
    # `loadtest --kill-worker-after`: the runtime replaces a killed worker by itself.
    replaces_workers: bool = False
    # Files in the run folder that `pipeline stop` deletes with the server: key files that
    # belong to one run (TorchServe's, which it mints at every start). A runtime whose token
    # outlives a restart lists none (the KServe runtime).
    removed_on_stop: tuple[str, ...] = ()
    description: str = ""
    # Shared options (SHARED_OPTIONS) this runtime cannot honour, each with why: `pipeline
    # serve` refuses them when given instead of starting a server that ignores them.
    refuses: ClassVar[Mapping[str, str]] = MappingProxyType({})

    # -- capabilities: present or None ---------------------------------------------------
    versions: ClassVar[Versions | None] = None  # rollout, rollback, status
    shadow: ClassVar[Shadow | None] = None  # --shadow and PrivateSettings.shadow_rate
    bench_report: ClassVar[BenchReport | None] = None  # bench.md notes and targets
    deploy: ClassVar[Deploy | None] = None  # `pipeline deploy <name>`
    packaging: ClassVar[Packaging | None] = None  # a package another system serves
    commands: ClassVar[Commands | None] = None  # its own `pipeline` subcommands
    nodes: ClassVar[Nodes | None] = None  # a cluster's nodes: loadtest --kill-node-after

    # -- the core -------------------------------------------------------------------
    @abc.abstractmethod
    def add_serve_options(self, group: argparse._ArgumentGroup, formats: list[str]) -> None:
        """Add this runtime's own `pipeline serve` options to `group` (its help group).
        They are refused with any other runtime. The shared options (--host, --port,
        --tls-cert, --tls-key, --max-request-size, --run-dir) are added by the CLI."""

    @abc.abstractmethod
    def serve(self, options: ServeOptions) -> Server:
        """Start the server `pipeline serve` asked for; return once it answers. Every
        shared option not in `refuses` must be honoured (read from `options`)."""

    @abc.abstractmethod
    def describe(self, server: Server) -> list[str]:
        """The lines `pipeline serve` prints about a started server (paths, never a key)."""

    @abc.abstractmethod
    def private(
        self, exported: ExportedModel, fmt: str, settings: PrivateSettings = DEFAULT_PRIVATE
    ) -> contextlib.AbstractContextManager[Server]:
        """A server of its own serving `exported` in `fmt`, on free loopback ports, stopped
        on exit (loadtest --serve, bench). Its `models[0]` is the served name."""

    @property
    @abc.abstractmethod
    def protocol(self) -> Protocol:
        """The wire protocol its servers speak (pipeline.serving.protocol): clients,
        loadtest, verify's served backends (pipeline.serving.backends, one per transport)
        and bench's drivers speak to it."""

    @abc.abstractmethod
    def worker_pids(self, server: Server, name: str) -> list[int]:
        """The processes that answer `name` (loadtest's memory and kill)."""

    @abc.abstractmethod
    def fix_command(
        self, model: str, server: Server | None = None, export_dir: Path | None = None
    ) -> str:
        """The command that makes a stale `server` serve the export in `export_dir` (or
        serve `model` at all): `server.restart_command` keeps how it was started."""

    @abc.abstractmethod
    def bench(
        self, model: str, exported: ExportedModel, settings: BenchSettings
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Serve `model` and measure every concurrency level: (points, skipped). Each point
        has `to_json()`; its backend is `<name>/<format>`."""


_REGISTRY: dict[str, Runtime] = {}


def register(runtime: Runtime) -> Runtime:
    """Add a runtime; its name and markers must be new, and a built-in runtime's names
    must be the ones `BUILTIN_RUNTIMES` declares."""
    names = next((d for d in BUILTIN_RUNTIMES if d.name == runtime.name), None)
    if names is not None and names != Declared(runtime.name, runtime.title):
        raise ValueError(
            f"runtime {runtime.name!r} registers {Declared(runtime.name, runtime.title)}, but "
            f"pipeline/serving/names.py declares {names}: change both"
        )
    for other in _REGISTRY.values():
        if other.name == runtime.name and type(other) is not type(runtime):
            raise ValueError(f"runtime {runtime.name!r} is registered twice")
        shared = set(other.markers) & set(runtime.markers)
        if other.name != runtime.name and shared:
            raise ValueError(f"runtime {runtime.name!r} reuses {other.name!r}'s markers {shared}")
    _REGISTRY[runtime.name] = runtime
    return runtime


def unregister(name: str) -> None:
    """Remove a runtime registered at run time (tests' own runtimes)."""
    if name in BUILTIN:
        raise ValueError(f"{name!r} is built in")
    _REGISTRY.pop(name, None)


def declared() -> tuple[Declared, ...]:
    """Every runtime's names, the built-ins first, without importing a runtime package."""
    extra = (Declared(r.name, r.title) for r in _REGISTRY.values() if r.name not in BUILTIN)
    return (*BUILTIN_RUNTIMES, *extra)


def names() -> tuple[str, ...]:
    return tuple(d.name for d in declared())


def default() -> str:
    """`pipeline serve`'s runtime when none is named."""
    return BUILTIN[0]


def all_runtimes() -> tuple[Runtime, ...]:
    _load_builtin()
    return tuple(_REGISTRY[n] for n in names() if n in _REGISTRY)


def get(name: str) -> Runtime:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise RuntimeNameError(
            f"Unknown runtime {name!r}; use one of {', '.join(names())}, e.g. --runtime {default()}."
        ) from None


def of(server: Server) -> Runtime:
    """The runtime a recorded server runs."""
    return get(server.runtime)


def markers() -> Iterator[str]:
    for runtime in all_runtimes():
        yield from runtime.markers


_loaded = False


def _load_builtin() -> None:
    # Imported here, lazily: the runtime packages import the shared serving layer.
    global _loaded
    if not _loaded:
        _loaded = True
        for name in BUILTIN:
            importlib.import_module(f"pipeline.runtimes.{name}")
