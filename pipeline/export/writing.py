"""Each asked format written into an export's staging folder, one after another: its
exporter, what every record carries (precision, size, how to run it when the format is
not built in), the int8/float16 verdict against the accuracy budget, and the errors of
the formats that could not be written (export decides what a partial export means)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import ExportError, ExportRequestError
from pipeline.export import quality
from pipeline.export.config import ExportConfig
from pipeline.export.partial import one_line
from pipeline.export.staging import remove_new
from pipeline.formats import base as registry
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime import formats
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger("pipeline.export")


def each_format(
    config: ExportConfig,
    model: torch.nn.Module,
    entry: ZooEntry,
    golden_inputs: Inputs,
    probes: list[tuple[str, Inputs]],
    output_shapes: dict[str, tuple],
    staging: Path,
    calibrate: Any,
    scratch: Path,
    per_sample: tuple[str, ...] = (),
) -> tuple[dict[str, ArtifactRecord], dict[str, str]]:
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
        fix_axes=dict(config.fix_axes),
        atol=config.atol,
        rtol=config.rtol,
        # A train-mode export is wrong on purpose (see ExportConfig.train_mode).
        check=not config.train_mode,
        calibration=calibrate,
        budget=config.budget,
        scratch=scratch,
        per_sample=per_sample,
        pt2_settings=config.pt2_settings,
    )
    written: dict[str, ArtifactRecord] = {}
    errors: dict[str, ExportError] = {}
    outside: dict[str, str] = {}  # written, but outside the accuracy budget: key → verdict
    for fmt in registry.all_formats():
        if fmt.key not in config.formats:
            continue
        before = set(staging.iterdir())
        try:
            if per_sample and fmt.precision != registry.FLOAT32:
                raise ExportError(
                    f"{fmt.title} is not made for models with per-sample outputs (detectors) "
                    "yet: their int8/float16 verdict needs a detection-level rule "
                    "(docs/export.md, 'Detection models')"
                )
            record = fmt.export(model, ctx)
            # What a table of size against accuracy needs, for every format alike.
            details = {
                "precision": fmt.precision,
                **record.details,
                "size_bytes": (staging / record.file).stat().st_size,
            }
            if fmt.key not in formats.BUILTIN:
                # How to run it, for serving processes that never imported its module.
                details[formats.RECORD_KEY] = fmt.descriptor.to_json()
            # int8/float16: judged by what the model still gets right, as verify will.
            if fmt.precision != registry.FLOAT32 and ctx.check:
                cases = [("golden", golden_inputs), *probes, *quality.random_cases(entry)]
                found = quality.measure(
                    model,
                    entry,
                    fmt.key,
                    staging / record.file,
                    fmt.precision,
                    config.budget,
                    cases,
                    details,
                )
                if found is not None:
                    details["quality"] = found
                    if not found["within_budget"]:
                        # Kept for inspection, marked, and failed: export exits 3 (partial).
                        details["outside_budget"] = True
                        outside[fmt.key] = outside_budget(found, served=fmt.served)
            written[fmt.key] = replace(record, details=details)
        except ExportRequestError:
            raise
        except ExportError as err:
            remove_new(staging, before)  # a half-written file must not ship
            log.debug("%s failed: %s", fmt.title, err)
            errors[fmt.key] = err
    if not written:  # (an outside-budget artifact counts as written: its file is kept)
        if len(errors) == 1:
            raise next(iter(errors.values()))
        raise ExportError(
            f"No format could be exported for {entry.name!r}, so nothing was written. "
            + " ".join(f"{registry.get(k).title}: {one_line(str(e))}" for k, e in errors.items())
        )
    return written, {k: one_line(str(e)) for k, e in errors.items()} | outside


def outside_budget(quality_record: dict[str, Any], served: bool = True) -> str:
    """The `failed` entry of an artifact judged outside its budget: the rule that decided.
    `served`: whether archive and serve could choose the format at all (a `.pte` is not)."""
    checks = [c for c in quality_record.get("checks", []) if not c.get("passed")]

    def num(x: Any) -> str:  # 47.65 dB, not 47.65119495595491 (the record keeps them whole)
        return f"{x:.2f}" if isinstance(x, float) else str(x)

    said = "; ".join(
        c.get("problem")
        or f"{c['rule']} rule: {c['metric']} {num(c['value'])} {c['unit']} against a bound of "
        f"{num(c['bound'])} {c['unit']} on {c['on']}"
        for c in checks
    )
    return (
        f"outside its accuracy budget ({said}). The file is kept for inspection, marked "
        "outside_budget; verify fails it" + (" and archive/serve never choose it" if served else "")
    )
