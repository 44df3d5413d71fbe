"""Partial exports: some formats written and checked, the others recorded as failed.

A model can use an op one format cannot express (`torch.linalg.eigvals` has
no ONNX conversion) while the other formats take it. Export then keeps what
it could make, lists the rest under `failed` in the manifest with the reason,
and `pipeline export` prints one paragraph and exits `EXIT_PARTIAL`, so a
script can tell "partial" (3) from "failed, nothing written" (1). An int8/float16
artifact judged outside its accuracy budget is partial the same way: listed under
`failed` with its verdict, its file kept (marked `outside_budget`) for inspection.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.checkpoint import read_sidecar
from pipeline.core.errors import ArtifactError, PipelineError
from pipeline.core.manifest import Manifest, read_manifest
from pipeline.formats import base as registry

if TYPE_CHECKING:
    from pipeline.zoo.spec import TensorSpec

# `pipeline export`'s exit status when at least one requested format was written
# and at least one failed. 1 stays "failed, nothing written"; 2 is argparse's.
EXIT_PARTIAL = 3


def one_line(text: str) -> str:
    """`text` with its whitespace (newlines included) collapsed: one paragraph, always."""
    return " ".join(str(text).split())


def _sentence(text: str) -> str:
    text = one_line(text)
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _titled(key: str) -> str:
    """'model.onnx (onnx)': the file and the key --format and the manifest use."""
    return f"{registry.get(key).file} ({key})"


def partial_message(manifest: Manifest, out_dir: Path) -> str:
    """The one paragraph `pipeline export` prints for a partial export."""
    failed = " ".join(
        f"{_titled(key)} was not written: {_sentence(reason)}"
        if key in manifest.unwritten
        else f"{_titled(key)} was written but is {_sentence(reason)}"
        for key, reason in manifest.failed.items()
    )
    held = [
        f.key
        for f in registry.all_formats()
        if f.key in manifest.artifacts and f.key not in manifest.failed
    ]
    # A float16 graph ONNX Runtime's CPU provider cannot run is written for GPU providers,
    # unchecked here: not "checked".
    unchecked = [k for k in held if manifest.artifact(k).details.get("cpu_runs") is False]
    written = [k for k in held if k not in unchecked]
    kept = (
        f"Written and checked in {out_dir}: {', '.join(map(_titled, written))}."
        if written
        else f"No format requested was written and checked in {out_dir}."
    )
    if unchecked:
        kept += (
            f" Written unchecked (ONNX Runtime's CPU provider cannot run it; verify it where "
            f"a GPU provider does): {', '.join(map(_titled, unchecked))}."
        )
    return (
        f"partial export of {manifest.model.name}: {failed} {kept} The manifest lists "
        f"{', '.join(manifest.failed)} under 'failed'; verify, archive and serve use the "
        f"formats written. Exit status {EXIT_PARTIAL} (partial)."
    )


def settled(
    out_dir: Path,
    model: str,
    formats: tuple[str, ...],
    checkpoint: Path | None = None,
    weights: str = "checkpoint",
    seed: int = 0,
    fix_axes: dict[str, int] | None = None,
    opset: int | None = None,
    inputs: list[TensorSpec] | None = None,
) -> Manifest | None:
    """The export in `out_dir` if it settles every one of `formats` from the same weights,
    else None (for --if-missing).

    A format is settled when the export holds it or recorded it as failed: an
    op ONNX cannot express fails the same way on every run, so --if-missing
    does not redo it; an export without --if-missing tries every format again.
    The weights must be the ones exported: `weights` "checkpoint" (the file at
    `checkpoint`, whose sidecar's sha256 the manifest must record: a retrained
    one is exported again), "random" (the same, made by --random-init with `seed`) or
    "imported" (--weights FILE: never settled, the file may hold new weights). And with
    the same settings: `fix_axes` (--fix-axis), `opset` and `inputs` (--input) as each
    format held records them; --if-missing kept a .pte fixed to seq=16 when asked for a
    dynamic one, and said "nothing to do" to the --fix-axis a partial export advised.
    """
    try:
        manifest = read_manifest(out_dir)
    except ArtifactError:
        return None
    done = set(manifest.artifacts) | set(manifest.failed)
    if manifest.model.name != model or not set(formats) <= done:
        return None
    if not _same_settings(manifest, formats, dict(fix_axes or {}), opset, inputs):
        return None
    if weights == "imported" or checkpoint is None:
        return None
    try:
        meta = read_sidecar(Path(checkpoint))
    except PipelineError:
        return None  # no checkpoint there: export makes one or says so
    if weights == "random" and (meta.get("init") != "random" or meta.get("seed") != seed):
        return None
    return manifest if meta.get("weights_sha256") == manifest.checkpoint.sha256 else None


# The torch.export formats, which --fix-axis compiles at one size (the others ignore it).
FIX_AXIS_FORMATS = ("pt2", "pt2_int8", "pte", "pte_int8")


def _same_settings(
    manifest: Manifest,
    formats: tuple[str, ...],
    fix_axes: dict[str, int],
    opset: int | None,
    inputs: list[TensorSpec] | None,
) -> bool:
    """Whether the export in `manifest` was made with these settings, as far as it records
    them: the fixed axes of each format --fix-axis applies to (the ONNX trace of a detector
    fixes its own), the ONNX opset, and the declared inputs."""
    if inputs is not None:
        asked = [(s.name, tuple(s.shape), str(s.dtype).removeprefix("torch.")) for s in inputs]
        if asked != [(r.name, tuple(r.shape), r.dtype) for r in manifest.inputs]:
            return False
    for key in formats:
        held = manifest.artifacts.get(key)
        fixable = key in FIX_AXIS_FORMATS
        if held is None:  # a recorded failure: --fix-axis is how one is tried again
            if fix_axes and fixable:
                return False
            continue
        if fixable and dict(held.details.get("fixed_axes") or {}) != fix_axes:
            return False
        if opset is not None and held.details.get("opset", opset) != opset:
            return False
    return True
