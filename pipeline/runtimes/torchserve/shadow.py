"""`pipeline serve --runtime torchserve --shadow RATE`: the serve side (issue 41).

The check itself runs in the workers (pipeline_runtime.handlershadow), which inherit
TorchServe's environment; this module writes the settings into it. An archive holds no
checkpoint, so each served archive is matched here with the export it was built from:
the export `pipeline serve` resolves for its model (the store's default version once
published, else <artifacts>/<model>/export) must hold the archived artifact (its
sha256, from the archive's archive.json) and a checkpoint. Otherwise the start is
refused: a reference built from another export would flag answers that are right, or
pass ones that are not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.manifest import read_manifest
from pipeline.runtimes.torchserve.store import read_info
from pipeline.serving import versions
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.server import ServeError
from pipeline.serving.shadowref import run as reference
from pipeline_runtime.handlershadow import (
    ENVIRONMENT,
    EXPORTS_ENV,
    MAX_RATE_ENV,
    RATE_ENV,
    REFERENCE_ENV,
    RUN_DIR_ENV,
)

__all__ = ["ENVIRONMENT", "ShadowConfig", "environment", "summary"]


@dataclass(frozen=True)
class ShadowConfig:
    rate: float  # the share of answered requests re-run on eager, (0, 1]
    max_rate: float  # the most samples each worker's reference checks a second
    # model (as exported) → the export `pipeline serve` serves it from
    # (ServeOptions.export_dir_of: the store's default version, else the export folder).
    export_dir_of: Callable[[str], Path]


def exports_of(config: ShadowConfig, store: Path, archives: list[str]) -> dict[str, list[str]]:
    """Served archive name → the export folders its workers may take their reference
    from: the one checked here first, then the model's published versions (a version
    that `pipeline rollout` registers later finds its own among them by sha256)."""
    out = {}
    for name in archives:
        mar = Path(store) / f"{name}.mar"
        info = read_info(mar)
        if info is None or not info.sha256:
            raise ServeError(
                f"--shadow: {mar} does not say which artifact it holds (no archive.json with "
                f"its sha256: another tool's archive, or an old one). Archive it again with "
                f"`pipeline archive`, or serve without --shadow."
            )
        home = Path(config.export_dir_of(info.model))
        problem = _unfit(home, info)
        if problem:
            raise ServeError(f"--shadow: {problem}")
        published = [v.dir for v in versions.versions(info.model, store)]
        out[name] = [str(Path(d).resolve()) for d in dict.fromkeys([home, *published])]
    return out


def _unfit(export_dir: Path, info: ServedInfo) -> str:
    """Why `export_dir` cannot be the reference of an archive of `info`, or ""."""
    try:
        manifest = read_manifest(export_dir)
    except PipelineError as err:
        return f"no reference for {info.model} ({info.format}): {err}"
    record = manifest.artifacts.get(info.format)
    if record is None or record.sha256 != info.sha256:
        held = f"sha256 {record.sha256[:12]}…" if record else "none"
        return (
            f"the {info.format} archive of {info.model} holds the artifact with sha256 "
            f"{info.sha256[:12]}…, but {export_dir}, the export serve checks it against, "
            f"holds {held}: the reference would be another export's. Archive that export "
            f"again (`pipeline archive --model {info.model}`), or serve without --shadow."
        )
    checkpoint = export_dir / manifest.checkpoint.path
    if not checkpoint.is_file() and not (export_dir / versions.CHECKPOINT).is_file():
        return (
            f"{export_dir} has no checkpoint ({checkpoint} is missing): the reference is the "
            "eager model built from it. Restore it, or serve without --shadow."
        )
    return ""


def environment(
    config: ShadowConfig, store: Path, archives: list[str], run_dir: Path
) -> dict[str, str]:
    """What TorchServe's environment carries to the workers' handlers
    (pipeline_runtime.handlershadow reads it)."""
    return {
        RATE_ENV: repr(float(config.rate)),
        MAX_RATE_ENV: repr(float(config.max_rate)),
        RUN_DIR_ENV: str(Path(run_dir).resolve()),
        # pipeline_runtime imports no `pipeline` module: it is told which one to run.
        REFERENCE_ENV: f"{reference.__module__}:{reference.__name__}",
        EXPORTS_ENV: json.dumps(exports_of(config, store, archives)),
    }


def summary(config: ShadowConfig) -> str:
    """What `pipeline serve` says about the check (server.json's extras)."""
    return (
        f"{config.rate:.3g} of answered requests re-run on eager, at most "
        f"{config.max_rate:g} a second per worker"
    )
