"""What export refuses or warns of before it writes anything: a checkpoint another export
was made from, a folder another model file's export holds, token ids with no range."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from pipeline.core import paths
from pipeline.core.checkpoint import read_sidecar
from pipeline.core.errors import ExportError, PipelineError
from pipeline.core.manifest import MANIFEST_NAME, read_manifest
from pipeline.zoo.spec import ZooEntry

log = logging.getLogger("pipeline.export")

_UNBOUNDED = (
    "input %r (%s) has no declared range, so the servers pass any value to the model: a "
    "token id past an nn.Embedding fails it, wraps round in ONNX Runtime, or aborts a .pt2 "
    "worker (three such requests a minute stop the KServe runtime). Declare the ids it "
    "takes: --input %s:...:0:VOCAB"
)


def refuse_replacing(ckpt_path: Path, out_dir: Path) -> None:
    """--weights or --random-init with --out-dir elsewhere wrote the checkpoint the export
    beside it was made from (`<model>/export`): its verify then failed ("not the checkpoint
    it was exported from"). Refused when that export is another folder than `out_dir`."""
    beside = ckpt_path.parent / "export"
    if not ckpt_path.is_file() or not beside.is_dir() or beside.resolve() == out_dir.resolve():
        return
    try:
        made_from = read_manifest(beside).checkpoint.sha256
        held = read_sidecar(ckpt_path)["weights_sha256"]
    except PipelineError:
        return  # not an export of this checkpoint: nothing of it to break
    if made_from == held:
        raise ExportError(
            f"This would replace {ckpt_path}, the checkpoint {beside} was exported from (its "
            "verify would then fail). Give these weights their own file with --checkpoint "
            f"PATH (e.g. {out_dir.with_name(out_dir.name + '-checkpoint.pt')}), or export into {beside}."
        )


def refuse_another_file(model: str, out_dir: Path) -> None:
    """`a/net.py:Net` and `b/net.py:Net` share the folder net_Net: the second export
    replaced the first's export and checkpoint without a word. Refused, naming both."""
    mine = model_file(model)
    try:
        held = read_manifest(out_dir) if mine and (out_dir / MANIFEST_NAME).is_file() else None
    except PipelineError:
        return  # an unreadable export is replaced, as before
    # Its file still there and another: two models (a file moved since is the same one).
    if (
        held is not None
        and held.model.file
        and held.model.file != mine
        and (Path(held.model.file).is_file())
    ):
        raise ExportError(
            f"{out_dir} holds the export of {held.model.file} ({held.model.name}), another "
            f"file than {mine}: both are named {paths.model_dir(model).name}. Export this "
            "one with --out-dir and --checkpoint elsewhere (or rename its file)."
        )


def model_file(name: str) -> str | None:
    """The absolute path of a `file.py:Class` model, so verify works from any directory."""
    where = name.rpartition(":")[0]
    return str(Path(where).resolve()) if where.endswith(".py") else None


def warn_unbounded(entry: ZooEntry) -> None:
    """Warn of each integer input with no declared range (a user's token ids given as
    `ids:int64:batch,seq`): a served .pt2 aborted its worker on an id past the vocabulary,
    and three a minute stopped the KServe runtime, with nothing said at export."""
    for spec in entry.inputs:
        if spec.bounded or spec.dtype == torch.bool or spec.dtype.is_floating_point:
            continue
        log.warning(_UNBOUNDED, spec.name, str(spec.dtype).removeprefix("torch."), spec.name)
