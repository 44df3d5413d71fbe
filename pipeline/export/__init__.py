"""The export stage: checkpoint → TorchScript, ONNX and/or `.pt2` + golden I/O + manifest."""

from __future__ import annotations

import datetime as dt
import io
import logging
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from pipeline import paths
from pipeline.checkpoint import (
    Checkpoint,
    import_state_dict,
    load_checkpoint,
    save_checkpoint,
    sidecar_path,
)
from pipeline.compare import DEFAULT_ATOL, DEFAULT_RTOL, flatten_outputs
from pipeline.errors import CheckpointError, ExportError
from pipeline.export.onnx_export import DEFAULT_OPSET, OPSET_REASON, to_onnx
from pipeline.export.pt2_export import Pt2Device, to_pt2
from pipeline.export.torchscript import METHODS, Method, ScriptResult, to_torchscript
from pipeline.fileio import sha256_file, write_json
from pipeline.manifest import MANIFEST_FORMAT, MANIFEST_NAME, tool_versions
from pipeline.zoo import DEFAULT_MODEL, resolve_entry
from pipeline.zoo.spec import Inputs, TensorSpec, ZooEntry, dtype_name

log = logging.getLogger(__name__)

TORCHSCRIPT_FILE = "model.torchscript.pt"
ONNX_FILE = "model.onnx"
PT2_FILE = "model.pt2"
# The formats `pipeline export --format` offers; "all" means every one.
FORMATS: tuple[str, ...] = ("torchscript", "onnx", "pt2")
# Exported unless --format says otherwise: .pt2 is opt-in because
# AOTInductor compiles C++ for each model (tens of seconds on a small CPU).
DEFAULT_FORMATS: tuple[str, ...] = ("torchscript", "onnx")
GOLDEN_FILE = "golden.pt"
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
    manifest: dict[str, Any]


def _plain(value: Any) -> Any:
    """Fresh, detached copies of every tensor in `value`.

    A tensor that picked up Python attributes on its way through the model is
    pickled with its `__dict__` (a `set` among them), which LibTorch's
    `torch::pickle_load` cannot read; a clone carries only the data.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().clone().contiguous()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _save_tensors(target: Path, payload: dict[str, Any]) -> None:
    buffer = io.BytesIO()  # in memory first: see checkpoint.state_dict_bytes
    torch.save(_plain(payload), buffer)
    target.write_bytes(buffer.getvalue())


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


def _swap_in(staging: Path, out_dir: Path) -> None:
    """Replace `out_dir` with `staging` so readers see the old export or the new one."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(old)
    try:
        staging.rename(out_dir)
    except BaseException:
        # An error or Ctrl-C between the two renames left no export at all (the old
        # one set aside under a hidden name, the new one deleted by the caller's
        # cleanup): put the old one back. (A SIGKILL here still needs two renames.)
        if old is not None:
            old.rename(out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _model_file(name: str) -> dict[str, str]:
    """The absolute path of a `file.py:Class` model, so verify works from any directory."""
    where = name.rpartition(":")[0]
    return {"file": str(Path(where).resolve())} if where.endswith(".py") else {}


def _checkpoint_for(entry: ZooEntry, ckpt_path: Path, config: ExportConfig) -> Checkpoint:
    """Our checkpoint at `ckpt_path`, first imported or initialised when asked."""
    meta = {
        "model": {"name": entry.name, "kwargs": dict(entry.kwargs)},
        "seed": config.seed,
        "epochs": 0,
    }
    if config.weights is not None:
        return import_state_dict(config.weights, ckpt_path, meta)
    if config.random_init:
        torch.manual_seed(config.seed)
        model = entry.build()
        return save_checkpoint(ckpt_path, model.state_dict(), {**meta, "init": "random"})
    if not ckpt_path.exists() and entry.source != "zoo":
        raise CheckpointError(
            f"Cannot use checkpoint {ckpt_path}: the file does not exist. {entry.name!r} is not "
            "trained by this pipeline: pass --weights FILE (a state_dict saved with torch.save) "
            "or --random-init to export it with seeded random weights."
        )
    return load_checkpoint(ckpt_path)


def _write_artifacts(
    config: ExportConfig,
    model: torch.nn.Module,
    entry: ZooEntry,
    golden_inputs: Inputs,
    probes: list[tuple[str, Inputs]],
    output_shapes: dict[str, tuple],
    staging: Path,
) -> dict[str, dict[str, Any]]:
    """Write the requested formats into `staging`; their manifest records."""
    records: dict[str, dict[str, Any]] = {}
    ts_cache: list[ScriptResult] = []

    def scripted() -> tuple[torch.jit.ScriptModule, str]:
        # TorchScript is made when asked for, or when ONNX falls back to the
        # TorchScript-based exporter; never twice.
        if not ts_cache:
            log.info("TorchScript (%s)…", config.method)
            ts_cache.append(
                to_torchscript(
                    model,
                    golden_inputs,
                    probes,
                    method=config.method,
                    allow_unsafe_trace=config.allow_unsafe_trace,
                    atol=config.atol,
                    rtol=config.rtol,
                    # A train-mode export is wrong on purpose (see ExportConfig.train_mode).
                    check=not config.train_mode,
                )
            )
        return ts_cache[0].module, ts_cache[0].method

    if "torchscript" in config.formats:
        scripted()
        ts = ts_cache[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # jit deprecation: see DESIGN.md
            torch.jit.save(ts.module, str(staging / TORCHSCRIPT_FILE))
        records["torchscript"] = {
            "file": TORCHSCRIPT_FILE,
            "format": "torchscript",
            "method": ts.method,
            "reason": ts.reason,
            "sha256": sha256_file(staging / TORCHSCRIPT_FILE),
        }
    if "onnx" in config.formats:
        log.info("ONNX (opset %d)…", config.opset)
        onnx_result = to_onnx(
            model, scripted, golden_inputs, entry, staging / ONNX_FILE, output_shapes, config.opset
        )
        records["onnx"] = {
            "file": ONNX_FILE,
            "format": "onnx",
            "exporter": onnx_result.exporter,
            "reason": onnx_result.reason,
            "opset": onnx_result.opset,
            "opset_reason": OPSET_REASON if config.opset == DEFAULT_OPSET else "set by --opset",
            "sha256": sha256_file(staging / ONNX_FILE),
        }
    if "pt2" in config.formats:
        log.info(".pt2 (torch.export + AOTInductor, %s)…", config.pt2_device)
        pt2 = to_pt2(
            model,
            golden_inputs,
            probes,
            entry,
            staging / PT2_FILE,
            device=config.pt2_device,
            atol=config.atol,
            rtol=config.rtol,
            check=not config.train_mode,  # wrong on purpose: see ExportConfig.train_mode
        )
        model.to("cpu")
        records["pt2"] = {
            "file": PT2_FILE,
            "format": "pt2",
            "method": pt2.method,
            "reason": pt2.reason,
            "device": pt2.device,
            "compile_seconds": round(pt2.compile_seconds, 1),
            "sha256": sha256_file(staging / PT2_FILE),
        }
    return records


def export(config: ExportConfig) -> ExportResult:
    """Export a trained checkpoint; every file is checked before the folder appears.

    With --weights or --random-init the new checkpoint is written to a pending
    folder and moved into place only when the export succeeded, so a failed
    export never replaces a good checkpoint.
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
        checkpoint = _checkpoint_for(
            entry, pending / ckpt_path.name if pending else ckpt_path, config
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
    if checkpoint.model_name != entry.name:
        raise CheckpointError(
            f"Checkpoint {ckpt_path} holds model {checkpoint.model_name!r}, not {entry.name!r}. "
            f"Pass --model {checkpoint.model_name} or the checkpoint of {entry.name}."
        )
    model = entry.build(**checkpoint.model_kwargs)
    try:
        model.load_state_dict(checkpoint.state_dict, strict=True)
    except RuntimeError as err:
        raise CheckpointError(
            f"Checkpoint {ckpt_path} does not fit model {entry.name!r}: "
            f"{' '.join(str(err).split())[:400]} "
            + (
                "Train it again with `pipeline train`."
                if entry.source == "zoo"
                else "Check that --weights and --model-kwargs belong to this class."
            )
        ) from None
    model.train(config.train_mode)

    generator = torch.Generator().manual_seed(EXPORT_SEED)
    golden_inputs: Inputs = entry.golden_inputs(generator)
    entry.check_inputs(golden_inputs)
    probes = entry.probe_inputs(generator, model)
    for _, probe in probes:
        entry.check_inputs(probe)
    try:
        with torch.no_grad():
            golden_outputs = flatten_outputs(model(*golden_inputs.values()))
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
    if not entry.outputs:  # a user model without output names: number them
        entry = replace(entry, outputs=tuple(f"output_{i}" for i in range(len(golden_outputs))))
    batch = next(iter(golden_inputs.values())).shape[0]
    output_shapes = _output_shapes(entry, golden_outputs, batch)

    out_dir = Path(config.out_dir) if config.out_dir else paths.export_dir(entry.name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        artifacts = _write_artifacts(
            config, model, entry, golden_inputs, probes, output_shapes, staging
        )
        _save_tensors(
            staging / GOLDEN_FILE,
            {
                "inputs": golden_inputs,
                "outputs": dict(zip(entry.outputs, golden_outputs, strict=True)),
            },
        )
        _save_tensors(staging / PROBES_FILE, {"probes": [[label, p] for label, p in probes]})
        manifest = {
            "format": MANIFEST_FORMAT,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "model": {
                "name": entry.name,
                "kwargs": checkpoint.model_kwargs,
                "task": entry.task,
                "source": entry.source,
                **_model_file(entry.name),
                "init": checkpoint.meta.get("init", "trained"),
            },
            "mode": "train" if config.train_mode else "eval",
            "checkpoint": {
                "path": os.path.relpath(ckpt_path.resolve(), out_dir.resolve()),
                "sha256": checkpoint.meta["weights_sha256"],
                "metrics": {
                    k: v for k, v in checkpoint.meta.get("metrics", {}).items() if k != "history"
                },
            },
            "inputs": [s.to_json() for s in entry.inputs],
            "outputs": [
                {"name": n, "shape": list(output_shapes[n]), "dtype": dtype_name(t.dtype)}
                for n, t in zip(entry.outputs, golden_outputs, strict=True)
            ],
            "tolerance": {"atol": config.atol, "rtol": config.rtol},
            "serving": dict(entry.serving),
            "artifacts": {
                **artifacts,
                "probes": {
                    "file": PROBES_FILE,
                    "format": "torch.save (weights_only)",
                    "count": len(probes),
                    "sha256": sha256_file(staging / PROBES_FILE),
                },
                "golden": {
                    "file": GOLDEN_FILE,
                    "format": "torch.save (weights_only)",
                    "batch": batch,
                    "sha256": sha256_file(staging / GOLDEN_FILE),
                },
            },
            "versions": tool_versions(),
        }
        write_json(staging / MANIFEST_NAME, manifest)
        _swap_in(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(out_dir=out_dir, manifest=manifest)
