"""The archive stage: an export folder → TorchServe `.mar` files in model_store/.

One archive per format (`<model>_ts.mar` for TorchScript, `<model>_onnx.mar`
for ONNX, `<model>_pt2.mar` for an AOTInductor package), each holding the artifact, the handler and its helpers, the
manifest (for the handler's sha256 check and I/O spec), the golden inputs (for
warm-up) and a `model-config.yaml` with the batching and worker settings.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from pipeline import paths
from pipeline.errors import PipelineError
from pipeline.manifest import artifact_path, read_manifest
from pipeline.zoo import DEFAULT_MODEL
from pipeline.zoo.user import model_slug

log = logging.getLogger(__name__)

HANDLERS_DIR = Path(__file__).resolve().parent.parent / "handlers"
HANDLER_HELPERS = ("pl_base_handler.py", "pl_codec.py")
# format → (manifest artifact key, handler file, archive suffix)
FORMATS: dict[str, tuple[str, str, str]] = {
    "torchscript": ("torchscript", "torchscript_handler.py", "ts"),
    "onnx": ("onnx", "onnx_handler.py", "onnx"),
    "pt2": ("pt2", "pt2_handler.py", "pt2"),
}
DEFAULT_STORE = Path("model_store")


class ArchiveError(PipelineError):
    """torch-model-archiver failed or its inputs are missing."""


@dataclass
class ArchiveConfig:
    model: str = DEFAULT_MODEL
    export_dir: Path | None = None  # default: artifacts/<model>/export
    store: Path = DEFAULT_STORE
    # None: every format the export holds.
    formats: tuple[str, ...] | None = None
    # model-config.yaml: TorchServe's per-model settings.
    batch_size: int = 8
    max_batch_delay_ms: int = 10
    min_workers: int = 1
    max_workers: int = 1
    response_timeout_s: int = 30
    startup_timeout_s: int = 120
    # None: TorchServe decides (a GPU worker when the server has GPUs, else CPU);
    # "cpu" pins workers to CPU even on a GPU server.
    device: Literal["cpu", "gpu"] | None = None

    def validate(self) -> None:
        unknown = [f for f in self.formats or () if f not in FORMATS]
        if unknown:
            raise ArchiveError(f"Unknown format(s) {unknown}; choose from {', '.join(FORMATS)}.")
        for name in (
            "batch_size",
            "min_workers",
            "max_workers",
            "response_timeout_s",
            "startup_timeout_s",
        ):
            if getattr(self, name) < 1:
                raise ArchiveError(f"--{name.replace('_', '-')} must be at least 1.")
        if self.max_batch_delay_ms < 0:
            raise ArchiveError("--max-batch-delay-ms must be 0 or more.")
        if self.min_workers > self.max_workers:
            raise ArchiveError("--min-workers cannot exceed --max-workers.")
        if self.device not in (None, "cpu", "gpu"):
            raise ArchiveError("--device must be cpu or gpu.")


def archive_name(model: str, fmt: str) -> str:
    """TorchServe model name: 'digits_lenet' + torchscript → 'digits_lenet_ts'."""
    return f"{model_slug(model)}_{FORMATS[fmt][2]}"


def model_config(config: ArchiveConfig) -> dict[str, object]:
    return {
        "minWorkers": config.min_workers,
        "maxWorkers": config.max_workers,
        "batchSize": config.batch_size,
        "maxBatchDelay": config.max_batch_delay_ms,
        "responseTimeout": config.response_timeout_s,
        "startupTimeout": config.startup_timeout_s,
        **({"deviceType": config.device} if config.device else {}),
    }


def _archiver() -> Path:
    exe = Path(sys.executable).parent / "torch-model-archiver"
    if not exe.exists():
        raise ArchiveError(
            f"torch-model-archiver is not installed next to {sys.executable}. Run `make venv` "
            "(it installs torch-model-archiver==0.12.0)."
        )
    return exe


def archive(config: ArchiveConfig) -> list[Path]:
    """Write one .mar per format; each appears in the store only once complete."""
    config.validate()
    export_dir = Path(config.export_dir) if config.export_dir else paths.export_dir(config.model)
    manifest = read_manifest(export_dir)
    if manifest["model"]["name"] != config.model:
        raise ArchiveError(
            f"{export_dir} holds {manifest['model']['name']!r}, not {config.model!r}."
        )
    store = Path(config.store)
    store.mkdir(parents=True, exist_ok=True)
    written = []
    formats = config.formats or tuple(f for f in FORMATS if FORMATS[f][0] in manifest["artifacts"])
    for fmt in formats:
        key, handler, _ = FORMATS[fmt]
        artifact = artifact_path(export_dir, manifest, key)  # checks its sha256
        golden = artifact_path(export_dir, manifest, "golden")
        name = archive_name(config.model, fmt)
        with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=store) as tmp:
            staging = Path(tmp)
            (staging / "model-config.yaml").write_text(
                yaml.safe_dump(model_config(config), sort_keys=False)
            )
            extra = [
                export_dir / "manifest.json",
                golden,
                *(HANDLERS_DIR / h for h in HANDLER_HELPERS),
            ]
            cmd = [
                str(_archiver()),
                "--model-name", name,
                "--version", "1.0",
                "--serialized-file", str(artifact),
                "--handler", str(HANDLERS_DIR / handler),
                "--extra-files", ",".join(str(p) for p in extra),
                "--config-file", str(staging / "model-config.yaml"),
                "--export-path", str(staging),
                "--force",
            ]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            built = staging / f"{name}.mar"
            if proc.returncode != 0 or not built.is_file():
                raise ArchiveError(
                    f"torch-model-archiver failed for {name}: {(proc.stderr or proc.stdout).strip()[-800:]}"
                )
            target = store / f"{name}.mar"
            built.replace(target)  # same filesystem: atomic
        log.info("wrote %s", target)
        written.append(target)
    return written
