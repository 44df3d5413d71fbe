"""The export stage: checkpoint → TorchScript, ONNX and/or `.pt2` + golden I/O + manifest."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from pipeline.core import paths
from pipeline.core.checkpoint import Checkpoint, sidecar_path
from pipeline.core.errors import ExportError, InputSpecError
from pipeline.core.fileio import atomic_write, sha256_file, staging_dir, sweep_abandoned
from pipeline.core.manifest import (
    MANIFEST_NAME,
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    Serving,
    TensorRecord,
    Tolerance,
    tool_versions,
)
from pipeline.export import guards
from pipeline.export.calibration import Calibration, calibration_for, load_file
from pipeline.export.config import (
    DEFAULT_FORMATS as DEFAULT_FORMATS,
)
from pipeline.export.config import FORMATS as FORMATS
from pipeline.export.config import KNOWN_FORMATS as KNOWN_FORMATS
from pipeline.export.config import PRECISION_FORMATS as PRECISION_FORMATS
from pipeline.export.config import ExportConfig
from pipeline.export.outshapes import output_shapes
from pipeline.export.partial import EXIT_PARTIAL as EXIT_PARTIAL  # re-exported for scripts
from pipeline.export.per_sample import per_sample_entry, per_sample_shapes
from pipeline.export.staging import save_tensors, save_warmup, swap_in
from pipeline.export.weights import checkpoint_for, model_from
from pipeline.export.writing import each_format
from pipeline.zoo import resolve_entry
from pipeline.zoo.spec import Inputs, ZooEntry, dtype_name
from pipeline_runtime.outputs import collate, flatten_outputs, output_keys, per_sample_fields

log = logging.getLogger(__name__)

GOLDEN_FILE = "golden.pt"
GOLDEN_KEY, PROBES_KEY = "golden", "probes"  # their manifest keys
PROBES_FILE = "probes.pt"
EXPORT_SEED = 1234  # seeds the random example/golden inputs of models without data


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    manifest: Manifest

    @property
    def failed(self) -> dict[str, str]:
        """Requested formats that could not be written (key → why); empty when all were."""
        return self.manifest.failed


def _output_shapes(
    entry: ZooEntry, model: torch.nn.Module, inputs: Inputs, outputs: list[torch.Tensor]
) -> dict[str, tuple]:
    if len(outputs) != len(entry.outputs):
        named = "--output names" if entry.source == "user" else "its zoo entry names"
        raise ExportError(
            f"Model {entry.name!r} returned {len(outputs)} outputs but {named} "
            f"{len(entry.outputs)}: {list(entry.outputs)}."
        )
    return output_shapes(entry, model, inputs, outputs)


def _output_names(outputs: Any, count: int) -> tuple[str, ...]:
    """A dict output's keys (`{"logits": ..}` → logits), else output_0, output_1, ..."""
    keys = output_keys(outputs)
    if all(keys) and len(set(keys)) == len(keys):
        return tuple(keys)
    return tuple(f"output_{i}" for i in range(count))


def _check_dict_names(names: tuple[str, ...], outputs: Any) -> None:
    """A dict's outputs are taken in its order; names other than its keys would rename
    them by position (`--output embedding --output logits` for {"logits", "embedding"}
    swapped the two in ONNX, in every server's answer and in verify's rows)."""
    keys = output_keys(outputs)
    if isinstance(outputs, dict) and all(keys) and list(names) != list(keys):
        raise ExportError(
            f"The model returns a dict with keys {', '.join(map(str, keys))}, but its outputs "
            f"are named {', '.join(names)}: outputs are taken in the dict's order, so name "
            "them by its keys in that order, or leave --output out (the keys name them)."
        )


def _write_artifacts(
    config: ExportConfig,
    model: torch.nn.Module,
    entry: ZooEntry,
    golden_inputs: Inputs,
    probes: list[tuple[str, Inputs]],
    output_shapes: dict[str, tuple],
    staging: Path,
    calibration: Calibration | None = None,
    per_sample: tuple[str, ...] | None = None,
) -> tuple[dict[str, ArtifactRecord], dict[str, str]]:
    """Each requested format's exporter, in registry order, writing into `staging`.

    Returns the formats written and those that failed (key → why). A format
    that cannot express the model (an `ExportError`) is recorded, its files are
    removed and the next format runs; a setting that cannot be honoured
    (`ExportRequestError`), an interruption or a bug stops the export. When
    every format fails, the error is raised: nothing is written.

    `calibration`: the --calibration file's batches, already checked; without it the
    formats that need calibration data get the zoo's split or synthetic inputs.
    """
    made: list[Calibration] = [calibration] if calibration is not None else []

    def calibrate() -> Calibration:  # built on first use: most exports need none
        if not made:
            made.append(calibration_for(entry, None))
        return made[0]

    scratch = staging_dir(".export-scratch-", staging.parent)
    try:
        return each_format(
            config,
            model,
            entry,
            golden_inputs,
            probes,
            output_shapes,
            staging,
            calibrate,
            scratch,
            per_sample or (),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def export(config: ExportConfig) -> ExportResult:
    """Export a trained checkpoint; every file is checked before the folder appears.

    A format that cannot express the model is recorded in the manifest's
    `failed` (and `ExportResult.failed`) while the others are written: check it
    (`pipeline export` exits `EXIT_PARTIAL`). When no format can be written the
    error is raised and nothing is written.

    With --weights or --random-init the new checkpoint is written to a pending
    folder and moved into place only when at least one format was written, so
    a failed export never replaces a good checkpoint.
    """
    config.validate()
    entry = resolve_entry(
        config.model,
        kwargs=config.model_kwargs,
        inputs=config.inputs,
        outputs=config.outputs,
        probes_file=config.probes_file,
    )
    axes = sorted({d for s in entry.inputs for d in s.shape if isinstance(d, str)})
    unknown = [a for a in config.fix_axes if a not in axes]
    if unknown:
        raise ExportError(
            f"--fix-axis {', '.join(unknown)}: {entry.name!r} has no such dynamic axis; its "
            f"dynamic axes are {', '.join(axes) or 'none'}."
        )
    # A --calibration file that does not fit the inputs is refused before anything is
    # written (a checkpoint included), whichever formats were asked for.
    calibration = load_file(config.calibration, entry) if config.calibration else None
    guards.refuse_another_file(entry.name, Path(config.out_dir or paths.export_dir(entry.name)))
    guards.warn_unbounded(entry)  # token ids with no range: the servers cannot refuse bad ones
    ckpt_path = Path(config.checkpoint) if config.checkpoint else paths.checkpoint_path(entry.name)
    # Not for a --checkpoint given: a mistyped path must stay an error, not random weights.
    default = config.checkpoint is None or config.checkpoint_default
    untrained = entry.source == "zoo" and entry.task is None and default
    untrained = untrained and not ckpt_path.exists()
    if untrained and config.weights is None and not config.random_init:
        # What `train` would write for a model with nothing to train: its seeded weights.
        log.info(
            "%s has nothing to train: exporting its seeded initial weights (as --random-init "
            "--seed %d)",
            entry.name,
            config.seed,
        )
        config = replace(config, random_init=True)
    pending: Path | None = None
    made = not ckpt_path.parent.exists()  # removed again, if left empty, when export fails
    if config.weights is not None or config.random_init:
        guards.refuse_replacing(ckpt_path, Path(config.out_dir or paths.export_dir(entry.name)))
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        sweep_abandoned(ckpt_path.parent)
        pending = staging_dir(".checkpoint-pending-", ckpt_path.parent)
    try:
        checkpoint = checkpoint_for(
            entry,
            pending / ckpt_path.name if pending else ckpt_path,
            weights=config.weights,
            random_init=config.random_init,
            seed=config.seed,
            # The golden inputs _export uses: a random-init model's scale is measured on them.
            golden=(
                entry.golden_inputs(torch.Generator().manual_seed(EXPORT_SEED))
                if config.random_init
                else {}
            ),
            atol=config.atol,
            rtol=config.rtol,
        )
        result = _export(config, entry, checkpoint, ckpt_path, calibration)
        if pending is not None:
            for name in (ckpt_path.name, sidecar_path(ckpt_path).name):  # weights, then sidecar
                (pending / name).replace(ckpt_path.parent / name)
        return result
    finally:
        if pending is not None:
            shutil.rmtree(pending, ignore_errors=True)
        if made and ckpt_path.parent.is_dir() and not any(ckpt_path.parent.iterdir()):
            ckpt_path.parent.rmdir()  # a failed first export leaves no empty model folder


def _export(
    config: ExportConfig,
    entry: ZooEntry,
    checkpoint: Checkpoint,
    ckpt_path: Path,
    calibration: Calibration | None = None,
) -> ExportResult:
    model = model_from(entry, checkpoint, ckpt_path)
    model.train(config.train_mode)

    generator = torch.Generator().manual_seed(EXPORT_SEED)
    golden_inputs: Inputs = entry.golden_inputs(generator)
    entry.check_inputs(golden_inputs)
    probes = entry.probe_inputs(generator, model)
    for label, probe in probes:
        try:
            entry.check_inputs(probe)
        except InputSpecError as err:  # say which probe, and from which file
            where = f" in {config.probes_file}" if config.probes_file else ""
            raise InputSpecError(f"Probe {label!r}{where}: {err}") from None
    try:
        with torch.no_grad():
            raw_outputs = model(*golden_inputs.values())
            golden_outputs = flatten_outputs(raw_outputs)
    except Exception as err:  # noqa: BLE001 - the user's forward rejected the declared inputs
        shapes = {
            k: f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
            for k, v in golden_inputs.items()
        }
        raise ExportError(
            f"{entry.name!r} failed on inputs built from its input spec {shapes}: "
            f"{type(err).__name__}: {' '.join(str(err).split())[:300]}. Check --input/--input-spec "
            "(names in forward() order, shapes, dtypes, value ranges)."
        ) from None
    batch = next(iter(golden_inputs.values())).shape[0]
    per_sample = per_sample_fields(raw_outputs, batch)
    if per_sample:  # a detector's boxes/scores/labels per image: collated, with counts
        entry, model = per_sample_entry(entry, model, per_sample)
        golden_outputs = collate(raw_outputs, per_sample)
        output_shapes = per_sample_shapes(entry, golden_outputs)
    else:
        if not entry.outputs:  # a user model without output names: its dict's keys, else numbers
            entry = replace(entry, outputs=_output_names(raw_outputs, len(golden_outputs)))
        _check_dict_names(entry.outputs, raw_outputs)
        output_shapes = _output_shapes(entry, model, golden_inputs, golden_outputs)

    out_dir = Path(config.out_dir) if config.out_dir else paths.export_dir(entry.name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    sweep_abandoned(out_dir.parent)  # an earlier export's, killed mid-way
    staging = staging_dir(f".{out_dir.name}.staging-", out_dir.parent)
    try:
        artifacts, failed = _write_artifacts(
            config,
            model,
            entry,
            golden_inputs,
            probes,
            output_shapes,
            staging,
            calibration,
            per_sample,
        )
        save_tensors(
            staging / GOLDEN_FILE,
            {
                "inputs": golden_inputs,
                "outputs": dict(zip(entry.outputs, golden_outputs, strict=True)),
            },
        )
        save_warmup(staging, golden_inputs, artifacts)
        save_tensors(staging / PROBES_FILE, {"probes": [[label, p] for label, p in probes]})
        artifacts[PROBES_KEY] = ArtifactRecord(
            PROBES_FILE,
            "torch.save (weights_only)",
            sha256_file(staging / PROBES_FILE),
            details={"count": len(probes)},
        )
        artifacts[GOLDEN_KEY] = ArtifactRecord(
            GOLDEN_FILE,
            "torch.save (weights_only)",
            sha256_file(staging / GOLDEN_FILE),
            details={"batch": batch},
        )
        manifest = Manifest(
            created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            model=ModelRecord(
                name=entry.name,
                kwargs=checkpoint.model_kwargs,
                task=entry.task,
                source=entry.source,
                file=guards.model_file(entry.name),
                init=checkpoint.meta.get("init", "trained"),
                init_note=str(checkpoint.meta.get("init_note", "")),
            ),
            mode="train" if config.train_mode else "eval",
            checkpoint=CheckpointRef(
                path=os.path.relpath(ckpt_path.resolve(), out_dir.resolve()),
                sha256=checkpoint.meta["weights_sha256"],
                metrics={
                    k: v for k, v in checkpoint.meta.get("metrics", {}).items() if k != "history"
                },
            ),
            inputs=tuple(s.record() for s in entry.inputs),
            outputs=tuple(
                TensorRecord(n, output_shapes[n], dtype_name(t.dtype))
                for n, t in zip(entry.outputs, golden_outputs, strict=True)
            ),
            tolerance=Tolerance(config.atol, config.rtol),
            serving=Serving.from_json(entry.serving),
            artifacts=artifacts,
            versions=tool_versions(),
            failed=failed,
            per_sample=per_sample or (),
        )
        manifest.validate()
        atomic_write(staging / MANIFEST_NAME, lambda tmp: tmp.write_text(manifest.dumps()))
        swap_in(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(out_dir=out_dir, manifest=manifest)
