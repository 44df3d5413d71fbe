"""What `pipeline serve --runtime kserve` hands the runtime process: one JSON file.

Shared by the launcher (which writes it into the run folder) and the runtime
(`python -m pipeline.runtimes.kserve.runtime <run_dir>/kserve.json`), so neither side
parses the other's command line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from pipeline.core.cpu import cores
from pipeline.runtimes.kserve.constants import CONFIG_FILE  # noqa: F401 - the runtime's marker
from pipeline.serving.provenance import ServedInfo

# `pipeline serve --runtime kserve`'s workers when not told: one per core it may use but
# one (left to the clients and the supervisor), at most this many (each worker holds its
# own copy of every model).
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """Runtime processes when not told: cores - 1, at least 1, at most MAX_DEFAULT_WORKERS.
    One process runs its Python request path on one core; more use more cores, but on the
    2-core machine, with the clients on the same cores, one worker answered 1,176 req/s
    at concurrency 8 and two 839 (issue 28, point 3): a core is left to the clients."""
    return max(1, min(cores() - 1, MAX_DEFAULT_WORKERS))


def default_threads(workers: int = 1) -> int:
    """Intra-op threads of each worker's forward passes when not told: the physical cores
    shared out among the workers, at least one (one worker: one per physical core, as
    before workers; TorchServe runs a single-threaded worker per core)."""
    physical = min(psutil.cpu_count(logical=False) or 1, cores())
    return max(1, physical // max(1, workers))


@dataclass(frozen=True)
class ServedExport:
    """One model the runtime serves: an export folder and the format to load from it."""

    name: str  # the Open Inference Protocol model name (/v2/models/<name>)
    export_dir: str
    format: str  # a registry key: torchscript, onnx, pt2
    # Its number in the versioned store (pipeline.serving.versions); None: an export folder
    # served as it is, not published (it answers as version 1).
    version: int | None = None
    # Its provenance, from the manifest read when it was chosen (launch.served_export), so
    # starting the runtime need not read it again. Not written to the runtime's config.
    info: ServedInfo | None = field(default=None, compare=False, repr=False)


@dataclass
class RuntimeConfig:
    models: list[ServedExport]
    host: str = "127.0.0.1"
    http_port: int = 8085
    grpc_port: int = 8086
    # JSON {"inference": {"key": ...}}. "": no token, for a pod behind KServe's ingress or
    # mesh (`pipeline deploy kserve`) and tests that say so; `pipeline serve` always sets one.
    token_file: str = ""
    max_request_size: int = 4 * 1024 * 1024  # bytes; 413 before the body is read
    tls_cert: str | None = None
    tls_key: str | None = None
    # Batching: requests already queued are stacked up to max_batch_size; a batch
    # waits at most max_batch_delay_ms for more (0: only what is already queued).
    max_batch_size: int = 8
    max_batch_delay_ms: float = 0.0
    threads: int = 1  # intra-op threads for the model calls, per worker
    # auto, cpu, cuda or cuda:N (serving.loading): "auto" lets one config serve on CPU in
    # the CPU image and on the GPU in the GPU image of `pipeline deploy kserve`.
    device: str = "auto"
    # Runtime processes sharing the ports (SO_REUSEPORT), each with its own models, batcher
    # and Guard, under the supervisor. 1 here (tests, bench's private servers); `pipeline
    # serve` passes --workers, default config.default_workers().
    workers: int = 1
    # The shadow check (shadow.py): the share of answered requests re-run on eager in a
    # process of each worker's own (0: off), and the most it checks a second.
    shadow_rate: float = 0.0
    shadow_max_rate: float = 20.0
    log_file: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    # The public keys --trust gave `serve` (launch.start fills them in): a worker checks a
    # store version against them and the store's trust folder as it loads it.
    trust: list[str] = field(default_factory=list)
    # The keys each store's policy held as `serve` started (signing.pins): a worker trusts
    # at most those, so a trust folder deleted or added to since changes nothing.
    pins: dict[str, list[str]] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        data = asdict(self)
        for model in data["models"]:
            del model["info"]
        Path(path).write_text(json.dumps(data, indent=2))

    @classmethod
    def read(cls, path: Path) -> RuntimeConfig:
        data = json.loads(Path(path).read_text())
        data["models"] = [ServedExport(**m) for m in data["models"]]
        return cls(**data)
