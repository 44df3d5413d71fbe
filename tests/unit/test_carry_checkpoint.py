"""A deploy folder carries the export's checkpoint (the image's runtime opens the export with
its eager model): the one the manifest records by sha256, never another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.checkpoint import sidecar_path
from pipeline.core.errors import ArtifactError
from pipeline.export.opened import carry_checkpoint
from tests.manifests import digits_manifest


def _checkpoint(path: Path, sha: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(sha.encode())
    sidecar_path(path).write_text(json.dumps({"weights_sha256": sha}))


def test_the_recorded_checkpoint_is_carried_and_a_retrained_one_refused(tmp_path: Path) -> None:
    export_dir = tmp_path / "m" / "export"
    export_dir.mkdir(parents=True)
    manifest = digits_manifest(checkpoint_sha="a" * 64)
    dest = tmp_path / "deploy" / "export"
    dest.mkdir(parents=True)
    _checkpoint(tmp_path / "m" / "checkpoint.pt", "a" * 64)
    carry_checkpoint(export_dir, manifest, dest)
    assert (dest / "checkpoint.pt").read_bytes() == b"a" * 64
    assert json.loads(sidecar_path(dest / "checkpoint.pt").read_text())["weights_sha256"]
    # Trained again after the export: the image would stop on open_export's sha256 check.
    _checkpoint(tmp_path / "m" / "checkpoint.pt", "b" * 64)
    with pytest.raises(ArtifactError, match=r"sha256 aaaaaaaaaaaa…\), which is not at"):
        carry_checkpoint(export_dir, manifest, tmp_path / "elsewhere")
    # A published version's own copy counts first.
    _checkpoint(export_dir / "checkpoint.pt", "a" * 64)
    carry_checkpoint(export_dir, manifest, dest)
    assert (dest / "checkpoint.pt").read_bytes() == b"a" * 64
