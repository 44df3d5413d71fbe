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

from pipeline.runtimes.kserve import CONFIG_FILE  # noqa: F401 - the runtime's marker
from pipeline.serving.provenance import ArchiveInfo


def default_threads() -> int:
    """Intra-op threads of the runtime's forward passes when not told: one per physical
    core. It runs one pass at a time per model (stacking what is queued), where TorchServe
    runs a single-threaded worker per core."""
    return psutil.cpu_count(logical=False) or 1


@dataclass(frozen=True)
class ServedExport:
    """One model the runtime serves: an export folder and the format to load from it."""

    name: str  # the Open Inference Protocol model name (/v2/models/<name>)
    export_dir: str
    format: str  # a registry key: torchscript, onnx, pt2
    # Its provenance, from the manifest read when it was chosen (launch.served_export), so
    # starting the runtime need not read it again. Not written to the runtime's config.
    info: ArchiveInfo | None = field(default=None, compare=False, repr=False)


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
    threads: int = 1  # intra-op threads for the model calls
    log_file: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

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
