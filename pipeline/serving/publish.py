"""`pipeline publish`: an export, vouched for by a passing verify report, becomes the
model's next version in the store (pipeline.serving.versions)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.manifest import read_manifest
from pipeline.formats import base as registry
from pipeline.serving import versions


@dataclass
class PublishConfig:
    model: str
    export_dir: Path | None = None  # default: <artifacts>/<model>/export
    report: Path | None = None  # default: <artifacts>/<model>/parity.json
    checkpoint: Path | None = None  # default: the manifest's, beside the export
    store: Path = paths.DEFAULT_STORE
    artifacts_dir: Path | None = None
    sign: Path | None = None  # an elliptic-curve private key: the version is signed with it
    key_password: str | None = None


def report_vouches(report: Path, export_dir: Path) -> str | None:
    """None when `report` is a passing verify report of this export written after it; else
    why not."""
    try:
        data = json.loads(Path(report).read_text())
    except FileNotFoundError:
        return f"there is no verify report at {report}"
    except (OSError, ValueError) as err:
        return f"{report} is unreadable ({err})"
    if Path(str(data.get("export_dir", ""))).resolve() != Path(export_dir).resolve():
        return f"{report} checked {data.get('export_dir')}, not {export_dir}"
    if Path(report).stat().st_mtime < (Path(export_dir) / "manifest.json").stat().st_mtime:
        return f"{report} is older than the export"
    if not data.get("passed"):
        return f"{report} records a failed verify"
    # Every format the export holds, checked: a `verify --backend torchscript` report
    # vouched for the .pt2 beside it, which nothing had run.
    ran = {str(row.get("backend")) for row in data.get("rows", []) if isinstance(row, dict)}
    manifest = read_manifest(export_dir)
    held = [
        f
        for f in registry.all_formats()
        if f.key in manifest.artifacts and f.key not in manifest.failed
    ]
    unchecked = [f.key for f in held if f.backend not in ran]
    if unchecked:
        return f"{report} did not check {', '.join(unchecked)}"
    return None


def publish_export(config: PublishConfig, say: Callable[[str], None] = print) -> versions.Published:
    if config.sign is not None and not Path(config.sign).is_file():
        raise PipelineError(f"--sign: there is no private key at {config.sign}.")
    export_dir = Path(config.export_dir or paths.export_dir(config.model, config.artifacts_dir))
    manifest = read_manifest(export_dir)  # a clear error when there is no export
    report = Path(
        config.report or paths.report_path(config.model, config.artifacts_dir, config.export_dir)
    )
    checkpoint = config.checkpoint or (export_dir / manifest.checkpoint.path).resolve()
    why = report_vouches(report, export_dir)
    if why is not None:
        from pipeline.verify import VerifyConfig, verify

        say(f"verifying {export_dir} first: {why}")
        checked = verify(
            VerifyConfig(
                model=config.model,
                export_dir=export_dir,
                checkpoint=Path(checkpoint),
                report=report,
            )
        )
        if not checked.passed:
            raise PipelineError(
                f"Not published: verify failed ({checked.path}).\n{checked.failure_message()}"
            )
    twin = versions.holding(config.model, export_dir, config.store)
    if twin is not None:
        say(
            f"note: version {twin.number} of {config.model} already holds these artifacts "
            f"(the same sha256s, {twin.dir}); publishing them again as a new version"
        )
    return versions.publish(
        config.model,
        export_dir,
        report,
        Path(checkpoint),
        config.store,
        sign=config.sign,
        key_password=config.key_password,
    )
