"""The manifest from the pipeline's side: read it with errors that say what to run.

The typed manifest itself (`Manifest` and its records) lives in
`pipeline_runtime.manifest`, because the handlers inside a `.mar` read it too.
Export is its only writer; every later stage reads it here and refuses an
artifact whose sha256 no longer matches it.
"""

from __future__ import annotations

import platform
from pathlib import Path

from pipeline import __version__
from pipeline.core.errors import ArtifactError
from pipeline_runtime.files import IntegrityError, check_sha256
from pipeline_runtime.manifest import (
    GOLDEN_KEY,
    MANIFEST_NAME,
    PROBES_KEY,
    SCHEMA,
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ManifestError,
    ModelRecord,
    Serving,
    TensorRecord,
    Tolerance,
)

MANIFEST_FORMAT = SCHEMA

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "ArtifactRecord",
    "CheckpointRef",
    "Manifest",
    "ModelRecord",
    "Serving",
    "TensorRecord",
    "Tolerance",
    "artifact_path",
    "read_manifest",
    "tool_versions",
]


def tool_versions() -> dict[str, str]:
    from importlib.metadata import version

    import torch  # here, not at the top: a torch-free KServe worker reads manifests too

    # The others' versions from their installed metadata: importing onnxscript for its
    # version took half a second in an export that writes no ONNX.
    return {
        "pipeline": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        **{name: version(name) for name in ("onnx", "onnxruntime", "onnxscript")},
    }


def read_manifest(export_dir: Path) -> Manifest:
    """Load `export_dir/manifest.json` or raise an `ArtifactError` saying what to run."""
    path = Path(export_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(
            f"No export found: {path} does not exist. Run `pipeline export` (or `make export`) "
            "first, or pass --export-dir with the folder `pipeline export` wrote."
        )
    try:
        return Manifest.read(export_dir)
    except ManifestError as err:
        raise ArtifactError(
            f"{path} cannot be used: {err}. Re-export with this version (`pipeline export`)."
        ) from None


def artifact_path(export_dir: Path, manifest: Manifest, key: str) -> Path:
    """Path of artifact `key`, after checking it exists and its sha256 matches."""
    record = manifest.artifacts.get(key)
    if record is None:
        how = "" if key in (GOLDEN_KEY, PROBES_KEY) else f" --format {key}"
        raise ArtifactError(
            f"The manifest in {export_dir} has no {key!r} artifact; re-run `pipeline export{how}`."
        )
    path = Path(export_dir) / record.file
    if not path.is_file():
        raise ArtifactError(
            f"Artifact {path} listed in the manifest is missing; re-run `pipeline export`."
        )
    try:
        return check_sha256(path, record.sha256)
    except IntegrityError as err:
        raise ArtifactError(str(err)) from None
