"""`manifest.json`: what an export folder holds, how it was made, and checks on it.

Every later stage (verify, archive, serve, the C++ client) reads the manifest
instead of guessing, and refuses a file whose sha256 no longer matches it.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import torch

from pipeline import __version__
from pipeline.errors import ArtifactError
from pipeline.fileio import sha256_file

MANIFEST_FORMAT = "pipeline.manifest/1"
MANIFEST_NAME = "manifest.json"


def tool_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript

    return {
        "pipeline": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxscript": onnxscript.__version__,
    }


def read_manifest(export_dir: Path) -> dict[str, Any]:
    """Load `export_dir/manifest.json` or raise an `ArtifactError` saying what to run."""
    path = Path(export_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(
            f"No export found: {path} does not exist. Run `pipeline export` (or `make export`) "
            "first, or pass --export-dir with the folder `pipeline export` wrote."
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(
            f"{path} is not valid JSON ({err}). Re-run `pipeline export`."
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ArtifactError(
            f"{path} is not a {MANIFEST_FORMAT} manifest. Re-run `pipeline export` with this version."
        )
    return manifest


def artifact_path(export_dir: Path, manifest: dict[str, Any], key: str) -> Path:
    """Path of artifact `key`, after checking it exists and its sha256 matches."""
    try:
        record = manifest["artifacts"][key]
    except KeyError:
        how = f" --format {key}" if key in ("torchscript", "onnx", "pt2") else ""
        raise ArtifactError(
            f"The manifest in {export_dir} has no {key!r} artifact; re-run `pipeline export{how}`."
        ) from None
    path = Path(export_dir) / record["file"]
    if not path.is_file():
        raise ArtifactError(
            f"Artifact {path} listed in the manifest is missing; re-run `pipeline export`."
        )
    actual = sha256_file(path)
    if actual != record["sha256"]:
        raise ArtifactError(
            f"Artifact {path} was modified after export: its sha256 is {actual}, the manifest "
            f"records {record['sha256']}. Refusing to use it; re-run `pipeline export` to "
            "regenerate it."
        )
    return path
