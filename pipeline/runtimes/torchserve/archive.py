"""The archive stage: an export folder → TorchServe `.mar` files in model_store/.

One archive per format, `<model>_<suffix>.mar` with the suffix and artifact the
format registry names. Each holds the artifact, its handler (`<key>_handler.py`,
written here from the format's key: `handler_source`), the
`pipeline_runtime` package the handler runs (so a worker needs nothing from
this repository), the export's `manifest.json` (the handler's sha256 check
and I/O contract), `golden.pt` (warm-up), `model-config.yaml` (batching and
workers) and `archive.json`: which model and format it is and, when `pipeline
bench` measured the model, its fastest verified backend. `pipeline serve`
and the client read `archive.json` instead of parsing archive names.

Packed with model-archiver's Python API; nothing is written into the export.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

import pipeline_runtime
from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.manifest import GOLDEN_KEY, MANIFEST_NAME, artifact_path, read_manifest
from pipeline.core.paths import DEFAULT_STORE
from pipeline.formats import base as registry
from pipeline.runtimes.torchserve.constants import ARCHIVE_INFO
from pipeline.serving import served
from pipeline.serving.provenance import ServedInfo, fastest_entry
from pipeline.serving.served import within_budget
from pipeline.zoo import DEFAULT_MODEL
from pipeline_runtime.manifest import Manifest

log = logging.getLogger(__name__)

RUNTIME_DIR = Path(pipeline_runtime.__file__).resolve().parent
# Where `pipeline bench` writes each model's fastest verified backend (under the artifacts root).


class ArchiveError(PipelineError):
    """model-archiver failed or its inputs are missing."""


def handler_source(key: str) -> str:
    """The entry point TorchServe imports for format `key`: a class naming the key over
    `pipeline_runtime.handler.PipelineHandler`, which does the work (the format's loader
    comes from its descriptor, pipeline_runtime.formats)."""
    if not key.isidentifier():
        raise ArchiveError(f"format key {key!r} cannot name a handler module")
    return (
        f'"""TorchServe handler for the pipeline\'s {key!r} artifacts, written by `pipeline archive`.\n'
        "\n"
        "Everything but the format key is `pipeline_runtime.handler` (shipped in the archive).\n"
        '"""\n\n'
        "from pipeline_runtime.handler import PipelineHandler\n\n\n"
        "class Handler(PipelineHandler):\n"
        f"    format_key = {key!r}\n"
    )


def _write_handler(staging: Path, key: str) -> Path:
    path = staging / f"{key}_handler.py"
    path.write_text(handler_source(key))
    return path


@dataclass
class ArchiveConfig:
    model: str = DEFAULT_MODEL
    export_dir: Path | None = None  # default: artifacts/<model>/export
    store: Path = DEFAULT_STORE
    # None: every format the export holds.
    formats: tuple[str, ...] | None = None
    # bench's fastest.json; None: <artifacts>/bench/fastest.json when it exists.
    bench_results: Path | None = None
    # model-config.yaml: TorchServe's per-model settings. Chosen by measurement
    # (docs/serving.md, "Dynamic batching"): TorchServe's aggregator waits up to
    # maxBatchDelay for a batch to fill even when nothing else is queued, so a
    # lone request pays the whole delay; 1 ms (its smallest: 0 means its 100 ms
    # default) costs a lone request about 1 ms and gave concurrency 8 the
    # throughput the old 10 ms gave.
    # TorchServe's model version in the archive (/predictions/<name>/<version>): a
    # published version's number for the archives a rollout registers.
    version: str = "1.0"
    batch_size: int = 8
    max_batch_delay_ms: int = 1
    min_workers: int = 1
    max_workers: int = 1
    response_timeout_s: int = 30
    startup_timeout_s: int = 120
    # None: TorchServe decides (a GPU worker when the server has GPUs, else CPU);
    # "cpu" pins workers to CPU even on a GPU server.
    device: Literal["cpu", "gpu"] | None = None
    # Bench's fastest is recorded only when its format is within the accuracy budget
    # (served.within_budget): the one export recorded, or these when given.
    accuracy_budget: float | None = None
    min_sqnr: float | None = None

    def validate(self) -> None:
        known = registry.keys()
        unknown = [f for f in self.formats or () if f not in known]
        if unknown:
            raise ArchiveError(f"Unknown format(s) {unknown}; choose from {', '.join(known)}.")
        for name in (
            "batch_size",
            "min_workers",
            "max_workers",
            "response_timeout_s",
            "startup_timeout_s",
        ):
            if getattr(self, name) < 1:
                flag = name.removesuffix("_s").replace("_", "-")  # the option's own name
                raise ArchiveError(f"--{flag} must be at least 1.")
        if self.max_batch_delay_ms < 0:
            raise ArchiveError("--max-batch-delay-ms must be 0 or more.")
        if self.max_batch_delay_ms == 0 and self.batch_size > 1:
            # TorchServe 0.12 (ModelManager) reads a maxBatchDelay of 0 as "unset" and
            # waits its 100 ms default for every batch instead.
            raise ArchiveError(
                "--max-batch-delay-ms 0 with --batch-size above 1 would make TorchServe wait "
                "its default 100 ms for every batch (it reads 0 as unset); use 1 or more."
            )
        if self.min_workers > self.max_workers:
            raise ArchiveError("--min-workers cannot exceed --max-workers.")
        if self.device not in (None, "cpu", "gpu"):
            raise ArchiveError("--device must be cpu or gpu.")
        if self.bench_results is not None and not Path(self.bench_results).is_file():
            raise ArchiveError(
                f"Bench results {self.bench_results} do not exist; run `pipeline bench`."
            )


def archive_name(model: str, fmt: str) -> str:
    """TorchServe model name: 'digits_lenet' + torchscript → 'digits_lenet_ts'."""
    return f"{paths.model_slug(model)}_{registry.get(fmt).served_suffix}"


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


def settings_of(mar: Path) -> dict[str, object]:
    """The ArchiveConfig fields an archive was built with (its model-config.yaml), so it
    can be built again from another export with the same settings; {} when unreadable."""
    try:
        with zipfile.ZipFile(mar) as zf:
            found = yaml.safe_load(zf.read("model-config.yaml")) or {}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, yaml.YAMLError):
        return {}
    names = {
        "minWorkers": "min_workers",
        "maxWorkers": "max_workers",
        "batchSize": "batch_size",
        "maxBatchDelay": "max_batch_delay_ms",
        "responseTimeout": "response_timeout_s",
        "startupTimeout": "startup_timeout_s",
        "deviceType": "device",
    }
    return {field: found[key] for key, field in names.items() if key in found}


def archive(config: ArchiveConfig, manifest: Manifest | None = None) -> list[Path]:
    """Write one .mar per format; each appears in the store only once complete.
    `manifest`: the export's, when the caller has read it."""
    config.validate()
    export_dir = Path(config.export_dir) if config.export_dir else paths.export_dir(config.model)
    manifest = manifest or read_manifest(export_dir)
    if manifest.model.name != config.model:
        raise ArchiveError(f"{export_dir} holds {manifest.model.name!r}, not {config.model!r}.")
    store = Path(config.store)
    store.mkdir(parents=True, exist_ok=True)
    # Bench's fastest verified backend, chosen again within the accuracy budget: an int8 or
    # float16 artifact that breaks it is never recorded as the one to serve.
    fastest = within_budget(
        fastest_entry(config.model, config.bench_results),
        manifest,
        config.accuracy_budget,
        config.min_sqnr,
    )
    formats = config.formats or tuple(served.servable(manifest))
    for key in config.formats or ():
        served.refuse_unserved(manifest, key)
    known = registry.keys()
    on_device = [k for k in manifest.artifacts if k in known and k not in formats]
    if not config.formats and on_device:
        log.info("not archiving %s: on-device, no runtime serves it", ", ".join(on_device))
    if not formats:
        raise ArchiveError(
            f"{export_dir} holds no format a server runs; export one (--format onnx)."
        )
    _check_failed(export_dir, manifest.unwritten, asked=config.formats, held=formats)
    golden = artifact_path(export_dir, manifest, GOLDEN_KEY)  # checked once, packed in each
    written = []
    for key in formats:
        registry.get(key)  # an unknown key is an error before anything is written
        artifact = artifact_path(export_dir, manifest, key)  # checks its sha256
        name = archive_name(config.model, key)
        info = ServedInfo.of(manifest, key, fastest)
        with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=store) as tmp:
            staging = Path(tmp)
            (staging / "model-config.yaml").write_text(
                yaml.safe_dump(model_config(config), sort_keys=False)
            )
            # A folder in extra_files has its contents copied into the archive's root:
            # this one holds the runtime package and archive.json.
            extra = staging / "extra"
            shutil.copytree(
                RUNTIME_DIR,
                extra / RUNTIME_DIR.name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
            (extra / ARCHIVE_INFO).write_text(json.dumps(info.to_json(), indent=2) + "\n")
            built = _package(
                name,
                staging,
                serialized_file=artifact,
                handler=_write_handler(staging, key),
                extra_files=[extra, export_dir / MANIFEST_NAME, golden],
                version=config.version,
            )
            target = store / f"{name}.mar"
            built.replace(target)  # same filesystem: atomic
        log.debug("wrote %s", target)  # the caller says what was written
        written.append(target)
    return written


def _check_failed(
    export_dir: Path, failed: dict[str, str], *, asked: tuple[str, ...] | None, held: tuple
) -> None:
    """Say which formats a partial export lacks: skipped when every format is archived,
    an error when one was asked for by name."""
    for key, reason in failed.items():
        why = " ".join(reason.split())
        if asked and key in asked:
            raise ArchiveError(
                f"{export_dir} has no {key} artifact: its export could not write it ({why}). "
                f"Archive the formats it holds ({', '.join(held) or 'none'}) or re-export."
            )
        if not asked:
            log.warning(
                "not archiving %s: the export could not write it (%s); archiving %s",
                key,
                why[:300] + ("…" if len(why) > 300 else ""),
                ", ".join(held),
            )


# model-archiver stages its files in <tempfile.gettempdir()>/<model name> and
# deletes that folder first, so two archives of one name built at once (bench's
# private store and a user's) would mix. Each build points it at its own
# staging folder instead; the lock keeps that swap to one build at a time.
_TEMPDIR_LOCK = threading.Lock()


def _package(
    name: str,
    staging: Path,
    *,
    serialized_file: Path,
    handler: Path,
    extra_files: list[Path],
    version: str = "1.0",
) -> Path:
    """`staging/<name>.mar`, built by model-archiver; ArchiveError says why it failed."""
    from model_archiver.model_archiver_config import ModelArchiverConfig
    from model_archiver.model_archiver_error import ModelArchiverError
    from model_archiver.model_packaging import package_model
    from model_archiver.model_packaging_utils import ModelExportUtils

    config = ModelArchiverConfig(
        model_name=name,
        handler=str(handler),
        version=version,
        serialized_file=str(serialized_file),
        extra_files=",".join(str(p) for p in extra_files),
        export_path=str(staging),
        force=True,
        config_file=str(staging / "model-config.yaml"),
        # Stored, not deflated: weights barely compress. Faster R-CNN's two 74 MB files
        # took 7.2 CPU-s to deflate (and 1.1 s to inflate at every TorchServe start)
        # for an archive 9% smaller; stored, 0.26 s and 0.16 s.
        archive_format="zip-store",
    )
    scratch = staging / "scratch"
    scratch.mkdir()
    # package_model rather than generate_model_archive: the latter also calls
    # logging.basicConfig, which would reconfigure the caller's logging.
    with _TEMPDIR_LOCK:
        saved, tempfile.tempdir = tempfile.tempdir, str(scratch)
        try:
            package_model(config, manifest=ModelExportUtils.generate_manifest_json(config))
        except (ModelArchiverError, OSError, ValueError) as err:
            raise ArchiveError(f"model-archiver could not build {name}.mar: {err}") from None
        finally:
            tempfile.tempdir = saved
    built = staging / f"{name}.mar"
    if not built.is_file():
        raise ArchiveError(f"model-archiver reported success but wrote no {built}.")
    return built
