"""The verify stage: every backend against eager PyTorch on the same inputs."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline import paths
from pipeline.checkpoint import load_checkpoint
from pipeline.compare import compare_tensor
from pipeline.errors import ArtifactError, PipelineError
from pipeline.fileio import write_json
from pipeline.manifest import artifact_path, read_manifest
from pipeline.verify.backends import (
    BACKENDS,
    Backend,
    EagerBackend,
    load_backends,
    local_backends,
    served_backends,
)
from pipeline.verify.report import ParityReport, Row
from pipeline.zoo import DEFAULT_MODEL, get_entry
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline.zoo.user import entry_from_manifest

log = logging.getLogger(__name__)

__all__ = ["BACKENDS", "ParityReport", "VerifyConfig", "verify"]


@dataclass
class VerifyConfig:
    model: str = DEFAULT_MODEL
    export_dir: Path | None = None  # default: artifacts/<model>/export
    checkpoint: Path | None = None  # default: the one recorded in the manifest
    # None: the local backends, plus TorchServe when a server from run_dir is
    # running and serves this model.
    backends: tuple[str, ...] | None = None
    run_dir: Path | None = None  # where `pipeline serve` recorded its server
    cpp_binary: Path | None = None  # default: cpp_client/build/run_torchscript, built if needed
    atol: float | None = None  # default: the manifest's tolerance
    rtol: float | None = None
    batch_sizes: tuple[int, ...] = (1, 7)
    seed: int = 0
    report: Path | None = None  # default: artifacts/<model>/parity.json

    def validate(self) -> None:
        unknown = [b for b in self.backends or () if b not in BACKENDS]
        if unknown:
            raise PipelineError(
                f"Unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}."
            )
        if any(b < 1 for b in self.batch_sizes):
            raise PipelineError("--batch-sizes must all be at least 1.")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise PipelineError(f"--{name} must be finite and non-negative, got {value}.")


def _load_tensors(export_dir: Path, manifest: dict[str, Any], key: str) -> Any:
    path = artifact_path(export_dir, manifest, key)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - report any unreadable file the same way
        raise ArtifactError(f"{path} cannot be read ({err}); re-run `pipeline export`.") from None


def _cases(
    entry: ZooEntry, export_dir: Path, manifest: dict[str, Any], config: VerifyConfig
) -> list[tuple[str, Inputs, dict[str, torch.Tensor] | None]]:
    """(label, inputs, stored golden outputs or None) for every input set.

    Golden and probe inputs are the ones export stored (so every backend, the
    C++ client included, sees the same tensors); fresh random batches are
    drawn here from the input spec.
    """
    golden = _load_tensors(export_dir, manifest, "golden")
    cases: list[tuple[str, Inputs, dict[str, torch.Tensor] | None]] = [
        ("golden", dict(golden["inputs"]), dict(golden["outputs"]))
    ]
    if "probes" in manifest["artifacts"]:
        stored = _load_tensors(export_dir, manifest, "probes")["probes"]
        cases += [(f"probe {label}", dict(inputs), None) for label, inputs in stored]
    fresh_gen = torch.Generator().manual_seed(config.seed)
    for batch in config.batch_sizes:
        cases.append(
            (f"random b={batch}", entry.sample_inputs(entry.sizes(batch=batch), fresh_gen), None)
        )
    # Every other dynamic axis (a sequence length) at a size export never used.
    others = sorted(
        {d for s in entry.inputs for d in s.shape if isinstance(d, str) and d != "batch"}
    )
    if others:
        sizes = entry.sizes(**{a: entry.sizes().get(a, 5) + 5 for a in others})
        label = " ".join(f"{a}={sizes[a]}" for a in others)
        cases.append((f"random {label}", entry.sample_inputs(sizes, fresh_gen), None))
    return cases


def load_reference(
    export_dir: Path, manifest: dict[str, Any], checkpoint: Path | None = None
) -> tuple[ZooEntry, torch.nn.Module]:
    """The zoo entry and the eager model holding the checkpoint this export came from."""
    entry = (
        entry_from_manifest(manifest)
        if manifest["model"].get("source", "zoo") != "zoo"
        else get_entry(manifest["model"]["name"])
    )
    ckpt_path = Path(checkpoint) if checkpoint else (export_dir / manifest["checkpoint"]["path"])
    loaded = load_checkpoint(ckpt_path)
    if loaded.meta["weights_sha256"] != manifest["checkpoint"]["sha256"]:
        raise ArtifactError(
            f"Checkpoint {ckpt_path} is not the one {export_dir} was exported from (sha256 "
            f"{loaded.meta['weights_sha256'][:12]}… vs {manifest['checkpoint']['sha256'][:12]}…). "
            "Re-run `pipeline export` for this checkpoint."
        )
    model = entry.build(**loaded.model_kwargs)
    model.load_state_dict(loaded.state_dict)
    return entry, model.eval()


def verify(config: VerifyConfig) -> ParityReport:
    """Compare every backend with eager on every case; write the JSON report.

    Returns the report; the caller decides what a failure does (the CLI exits 1).
    """
    config.validate()
    export_dir = Path(config.export_dir) if config.export_dir else paths.export_dir(config.model)
    manifest = read_manifest(export_dir)
    if manifest["model"]["name"] != config.model:
        raise ArtifactError(
            f"{export_dir} holds an export of {manifest['model']['name']!r}, not {config.model!r}. "
            f"Pass --model {manifest['model']['name']!r} or another --export-dir."
        )
    atol = config.atol if config.atol is not None else float(manifest["tolerance"]["atol"])
    rtol = config.rtol if config.rtol is not None else float(manifest["tolerance"]["rtol"])
    entry, model = load_reference(export_dir, manifest, config.checkpoint)
    eager = EagerBackend(model)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        wanted = config.backends or local_backends(manifest)
        backends: list[Backend] = [
            backend
            for name in wanted
            if name != "torchserve"
            for backend in load_backends(name, export_dir, manifest, config.cpp_binary)
        ]
    if "torchserve" in (config.backends or ()):
        backends += served_backends(config.model, manifest, config.run_dir)
    elif config.backends is None:
        # No server running for this model: verify the local backends only.
        with contextlib.suppress(PipelineError):
            backends += served_backends(config.model, manifest, config.run_dir)

    output_names = [o["name"] for o in manifest["outputs"]]
    rows: list[Row] = []
    cases = _cases(entry, export_dir, manifest, config)
    for backend in backends:
        prepare = getattr(backend, "prepare", None)
        if prepare is not None:  # backends that run every case in one go (the C++ client)
            try:
                prepare([inputs for _, inputs, _ in cases])
            except Exception as err:  # noqa: BLE001 - reported per case below, via run()
                log.warning("%s could not run all cases at once: %s", backend.name, err)
    for label, inputs, stored in cases:
        entry.check_inputs(inputs)
        try:
            expected = eager.run(inputs)
        except Exception as err:  # noqa: BLE001 - the reference itself cannot run these inputs
            raise PipelineError(
                f"Eager {entry.name!r} fails on the {label!r} inputs, so there is no reference to "
                f"compare with: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
            ) from None
        if stored is not None:
            for name, ref in zip(output_names, expected, strict=True):
                rows.append(
                    Row.of(
                        "golden file",
                        label,
                        name,
                        compare_tensor(ref, stored[name], atol, rtol),
                        atol,
                        rtol,
                    )
                )
        for backend in backends:
            try:
                actual = backend.run(inputs)
            except Exception as err:  # noqa: BLE001 - a crashing backend is a failed check
                rows += [Row.crashed(backend.name, label, n, err, atol, rtol) for n in output_names]
                continue
            if len(actual) != len(expected):
                rows.append(
                    Row.crashed(
                        backend.name,
                        label,
                        "*",
                        RuntimeError(f"returned {len(actual)} outputs, expected {len(expected)}"),
                        atol,
                        rtol,
                    )
                )
                continue
            for name, ref, got in zip(output_names, expected, actual, strict=True):
                rows.append(
                    Row.of(
                        backend.name, label, name, compare_tensor(ref, got, atol, rtol), atol, rtol
                    )
                )

    report = ParityReport(
        model=entry.name,
        export_dir=str(export_dir),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        tolerance={"atol": atol, "rtol": rtol},
        artifacts={
            k: {
                kk: v.get(kk) for kk in ("file", "method", "exporter", "opset", "reason") if kk in v
            }
            for k, v in manifest["artifacts"].items()
        },
        rows=rows,
    )
    report_path = Path(config.report) if config.report else paths.report_path(entry.name)
    write_json(report_path, report.to_json())
    report.path = report_path
    return report
