"""The export stage: checkpoint → TorchScript, ONNX and/or `.pt2` + golden I/O + manifest."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from pipeline.core import paths
from pipeline.core.checkpoint import Checkpoint, sidecar_path
from pipeline.core.compare import DEFAULT_ATOL, DEFAULT_RTOL
from pipeline.core.errors import ExportError, ExportRequestError
from pipeline.core.fileio import atomic_write, sha256_file
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
from pipeline.export.partial import EXIT_PARTIAL as EXIT_PARTIAL  # re-exported for scripts
from pipeline.export.partial import one_line
from pipeline.export.staging import remove_new, save_tensors, swap_in
from pipeline.export.weights import checkpoint_for, model_from
from pipeline.formats import base as registry
from pipeline.formats.onnx import DEFAULT_OPSET
from pipeline.formats.pt2 import Pt2Device
from pipeline.formats.torchscript import METHODS, Method
from pipeline.zoo import DEFAULT_MODEL, resolve_entry
from pipeline.zoo.spec import Inputs, TensorSpec, ZooEntry, dtype_name
from pipeline_runtime.outputs import flatten_outputs, output_keys

log = logging.getLogger(__name__)

# The formats `pipeline export --format` offers ("all" means every one) and the
# ones written without --format: both from the registry (pipeline/formats/).
FORMATS: tuple[str, ...] = registry.keys()
DEFAULT_FORMATS: tuple[str, ...] = registry.default_keys()
GOLDEN_FILE = "golden.pt"
GOLDEN_KEY, PROBES_KEY = "golden", "probes"  # their manifest keys
PROBES_FILE = "probes.pt"
EXPORT_SEED = 1234  # seeds the random example/golden inputs of models without data


@dataclass
class ExportConfig:
    model: str = DEFAULT_MODEL
    checkpoint: Path | None = None  # default: artifacts/<model>/checkpoint.pt
    out_dir: Path | None = None  # default: artifacts/<model>/export
    formats: tuple[str, ...] = DEFAULT_FORMATS
    method: Method = "auto"
    pt2_device: Pt2Device = "cpu"
    allow_unsafe_trace: bool = False
    opset: int = DEFAULT_OPSET
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    # Export the model in train() mode. Only for demonstrating that verify
    # catches the classic forgotten-eval() bug; never what a user wants.
    train_mode: bool = False
    # Models outside the zoo (module:Class, file.py:Class, torchvision:NAME).
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: list[TensorSpec] | None = None
    outputs: list[str] | None = None
    probes_file: Path | None = None  # extra probe inputs (torch.save'd dicts)
    # Where the weights come from when there is no checkpoint of ours yet:
    weights: Path | None = None  # a state_dict saved elsewhere; imported (weights_only)
    random_init: bool = False  # seeded random initialisation
    seed: int = 0

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, *, inputs: list | None = None, outputs: list | None = None
    ) -> ExportConfig:
        """The config `pipeline export` ARGS describe (inputs/outputs parsed by the CLI)."""
        from pipeline.zoo.user import parse_kwargs

        chosen = args.format or ()
        if not chosen:
            formats = DEFAULT_FORMATS
        elif "all" in chosen:
            formats = FORMATS
        else:
            formats = tuple(dict.fromkeys(chosen))  # in the order given, once each
        return cls(
            model=args.model,
            model_kwargs=parse_kwargs(args.model_kwargs),
            inputs=inputs,
            outputs=outputs,
            probes_file=args.probes,
            weights=args.weights,
            random_init=args.random_init,
            seed=args.seed,
            checkpoint=args.checkpoint or paths.checkpoint_path(args.model, args.artifacts_dir),
            out_dir=args.out_dir or paths.export_dir(args.model, args.artifacts_dir),
            formats=formats,
            pt2_device=args.pt2_device,
            method=args.method,
            allow_unsafe_trace=args.allow_unsafe_trace,
            opset=args.opset,
            atol=args.atol,
            rtol=args.rtol,
        )

    def validate(self) -> None:
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise ExportError(
                f"Unknown --format {', '.join(unknown) or '(none)'}; use one or more of "
                f"{', '.join(FORMATS)} or all, e.g. --format torchscript --format pt2."
            )
        if self.pt2_device not in ("cpu", "cuda"):
            raise ExportError(f"--pt2-device must be cpu or cuda, got {self.pt2_device!r}.")
        if self.method not in METHODS:
            raise ExportError(f"Unknown --method {self.method!r}; use one of {', '.join(METHODS)}.")
        if not 7 <= self.opset <= 23:
            raise ExportError(f"--opset must be between 7 and 23, got {self.opset}.")
        if not all(math.isfinite(t) and t >= 0 for t in (self.atol, self.rtol)):
            raise ExportError("--atol and --rtol must be finite and non-negative.")
        if not 0 <= self.seed < 2**63:
            raise ExportError(f"--seed must be between 0 and 2**63 - 1, got {self.seed}.")
        if self.weights is not None and self.random_init:
            raise ExportError("Give either --weights or --random-init, not both.")


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    manifest: Manifest

    @property
    def failed(self) -> dict[str, str]:
        """Requested formats that could not be written (key → why); empty when all were."""
        return self.manifest.failed


def _output_shapes(entry: ZooEntry, outputs: list[torch.Tensor], batch: int) -> dict[str, tuple]:
    if len(outputs) != len(entry.outputs):
        raise ExportError(
            f"Model {entry.name!r} returned {len(outputs)} outputs but its zoo entry names "
            f"{len(entry.outputs)}: {list(entry.outputs)}."
        )
    return {
        name: tuple("batch" if i == 0 and n == batch else n for i, n in enumerate(t.shape))
        for name, t in zip(entry.outputs, outputs, strict=True)
    }


def _output_names(outputs: Any, count: int) -> tuple[str, ...]:
    """A dict output's keys (`{"logits": ..}` → logits), else output_0, output_1, ..."""
    keys = output_keys(outputs)
    if all(keys) and len(set(keys)) == len(keys):
        return tuple(keys)
    return tuple(f"output_{i}" for i in range(count))


def _model_file(name: str) -> str | None:
    """The absolute path of a `file.py:Class` model, so verify works from any directory."""
    where = name.rpartition(":")[0]
    return str(Path(where).resolve()) if where.endswith(".py") else None


def _write_artifacts(
    config: ExportConfig,
    model: torch.nn.Module,
    entry: ZooEntry,
    golden_inputs: Inputs,
    probes: list[tuple[str, Inputs]],
    output_shapes: dict[str, tuple],
    staging: Path,
) -> tuple[dict[str, ArtifactRecord], dict[str, str]]:
    """Each requested format's exporter, in registry order, writing into `staging`.

    Returns the formats written and those that failed (key → why). A format
    that cannot express the model (an `ExportError`) is recorded, its files are
    removed and the next format runs; a setting that cannot be honoured
    (`ExportRequestError`), an interruption or a bug stops the export. When
    every format fails, the error is raised: nothing is written.
    """
    ctx = registry.ExportContext(
        entry=entry,
        golden=golden_inputs,
        probes=probes,
        output_shapes=output_shapes,
        out_dir=staging,
        method=config.method,
        allow_unsafe_trace=config.allow_unsafe_trace,
        opset=config.opset,
        pt2_device=config.pt2_device,
        atol=config.atol,
        rtol=config.rtol,
        # A train-mode export is wrong on purpose (see ExportConfig.train_mode).
        check=not config.train_mode,
    )
    written: dict[str, ArtifactRecord] = {}
    errors: dict[str, ExportError] = {}
    for fmt in registry.all_formats():
        if fmt.key not in config.formats:
            continue
        before = set(staging.iterdir())
        try:
            written[fmt.key] = fmt.export(model, ctx)
        except ExportRequestError:
            raise
        except ExportError as err:
            remove_new(staging, before)  # a half-written file must not ship
            log.debug("%s failed: %s", fmt.title, err)
            errors[fmt.key] = err
    if not written:
        if len(errors) == 1:
            raise next(iter(errors.values()))
        raise ExportError(
            f"No format could be exported for {entry.name!r}, so nothing was written. "
            + " ".join(f"{registry.get(k).title}: {one_line(str(e))}" for k, e in errors.items())
        )
    return written, {k: one_line(str(e)) for k, e in errors.items()}


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
    ckpt_path = Path(config.checkpoint) if config.checkpoint else paths.checkpoint_path(entry.name)
    pending: Path | None = None
    if config.weights is not None or config.random_init:
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        pending = Path(tempfile.mkdtemp(prefix=".checkpoint-pending-", dir=ckpt_path.parent))
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
        result = _export(config, entry, checkpoint, ckpt_path)
        if pending is not None:
            for name in (ckpt_path.name, sidecar_path(ckpt_path).name):  # weights, then sidecar
                (pending / name).replace(ckpt_path.parent / name)
        return result
    finally:
        if pending is not None:
            shutil.rmtree(pending, ignore_errors=True)


def _export(
    config: ExportConfig, entry: ZooEntry, checkpoint: Checkpoint, ckpt_path: Path
) -> ExportResult:
    model = model_from(entry, checkpoint, ckpt_path)
    model.train(config.train_mode)

    generator = torch.Generator().manual_seed(EXPORT_SEED)
    golden_inputs: Inputs = entry.golden_inputs(generator)
    entry.check_inputs(golden_inputs)
    probes = entry.probe_inputs(generator, model)
    for _, probe in probes:
        entry.check_inputs(probe)
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
    if not entry.outputs:  # a user model without output names: its dict's keys, else numbers
        entry = replace(entry, outputs=_output_names(raw_outputs, len(golden_outputs)))
    batch = next(iter(golden_inputs.values())).shape[0]
    output_shapes = _output_shapes(entry, golden_outputs, batch)

    out_dir = Path(config.out_dir) if config.out_dir else paths.export_dir(entry.name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        artifacts, failed = _write_artifacts(
            config, model, entry, golden_inputs, probes, output_shapes, staging
        )
        save_tensors(
            staging / GOLDEN_FILE,
            {
                "inputs": golden_inputs,
                "outputs": dict(zip(entry.outputs, golden_outputs, strict=True)),
            },
        )
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
                file=_model_file(entry.name),
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
        )
        manifest.validate()
        atomic_write(staging / MANIFEST_NAME, lambda tmp: tmp.write_text(manifest.dumps()))
        swap_in(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(out_dir=out_dir, manifest=manifest)
