"""The digits CNN's manifest as unit tests build it by hand (no export behind it): one
place instead of a near-copy in every test module that needs one."""

from __future__ import annotations

from typing import Any

from pipeline_runtime.manifest import (
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    TensorRecord,
    Tolerance,
)


def digits_manifest(
    artifacts: dict[str, ArtifactRecord] | None = None,
    *,
    checkpoint: str = "../checkpoint.pt",
    checkpoint_sha: str = "c" * 64,
    **changes: Any,
) -> Manifest:
    """digits_lenet's inputs, outputs and tolerance; `artifacts` (default none), the
    checkpoint's path and sha256, and any other Manifest field given in `changes`."""
    return Manifest(
        model=ModelRecord("digits_lenet"),
        inputs=(TensorRecord("image", ("batch", 1, 28, 28), "float32"),),
        outputs=(TensorRecord("logits", ("batch", 10), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef(checkpoint, checkpoint_sha),
        artifacts=artifacts or {},
        **changes,
    )
