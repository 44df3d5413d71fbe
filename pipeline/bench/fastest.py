"""`fastest.json`: each model's fastest verified backend, as bench measured it.

Bench writes its own results and never edits an export (export is the
manifest's only writer). The file sits beside bench.json and maps each
model, as bench was given it ("digits_lenet", "torchvision:resnet18"), to
its fastest verified backend at batch 1 and the registry format that backend
runs, which is what `pipeline archive` reads to package one format:

    {"digits_lenet": {"backend": "onnxruntime", "format": "onnx", "median_ms": 0.04,
                      "batch": 1, "ranking": ["onnxruntime", "torchscript", ...],
                      "precision": "float32",
                      "candidates": [{"backend": "onnxruntime", "format": "onnx",
                                      "precision": "float32", "median_ms": 0.04}, ...],
                      "excluded": [{"backend": "onnxruntime_fp16", "format": "onnx_fp16",
                                    "precision": "float16", "why": "..."}],
                      "why": "onnxruntime (onnx) is the fastest ...",
                      "measured": "2025-01-01T00:00:00+00:00"}}

"Verified" is verify's verdict, which bench asks for on the same export: float32
formats must match eager elementwise, int8/float16 formats must stay within the
accuracy budget the export recorded (pipeline/export/quality.py). So the fastest
backend is the fastest *within the budget*, never one that breaks it, and
`excluded` says which were left out and why. `candidates` keeps the whole
ranking so that archive and serve can choose again under a stricter
`--accuracy-budget` (pipeline.serving.served.within_budget).

A later run replaces the entries of the models it measured and keeps the others.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.core import paths
from pipeline.core.fileio import write_json
from pipeline.formats import base as registry
from pipeline.formats.base import FLOAT32, precision_of, served_keys

log = logging.getLogger(__name__)

FASTEST_NAME = paths.fastest_path(Path(".")).name  # the file `pipeline archive` reads
BATCH = 1  # ranked at batch 1: one request's latency, what a served model answers


def fastest_of(cells: list[dict[str, Any]], *, exclude_suffix: str = "") -> dict[str, Any] | None:
    """The fastest verified backend at batch 1 among one model's CELLS (bench.json rows), or
    None when none was verified. Candidates are the backends the servers run, each format's
    own (`onnxruntime` for onnx): not eager, a frozen TorchScript or an opset-20 conversion
    (fastest.json named "onnxruntime (opset 20)", which no server runs), nor backends
    ending in `exclude_suffix`, nor on-device formats (.pte)."""
    served = served_keys()
    ranked = sorted(
        (
            c
            for c in cells
            if c["batch"] == BATCH
            and c.get("verified")
            and c.get("format") in served
            and c["backend"] == registry.get(c["format"]).backend
            and not (exclude_suffix and c["backend"].endswith(exclude_suffix))
        ),
        key=lambda c: c["median_ms"],
    )
    if not ranked:
        return None
    best = ranked[0]
    excluded = [
        {
            "backend": c["backend"],
            "format": c["format"],
            "precision": precision_of(c["format"]),
            "why": _why_excluded(c["format"]),
        }
        for c in cells
        if c["batch"] == BATCH
        and c.get("format") in served
        and not c.get("verified")
        and not (exclude_suffix and c["backend"].endswith(exclude_suffix))
    ]
    return {
        "backend": best["backend"],
        "format": best["format"],
        "precision": precision_of(best["format"]),
        "median_ms": round(best["median_ms"], 4),
        "batch": BATCH,
        "ranking": [c["backend"] for c in ranked],
        "candidates": [
            {
                "backend": c["backend"],
                "format": c["format"],
                "precision": precision_of(c["format"]),
                "median_ms": round(c["median_ms"], 4),
            }
            for c in ranked
        ],
        "excluded": excluded,
        "why": _why(best, len(ranked), excluded),
        "measured": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _why_excluded(fmt: str) -> str:
    if precision_of(fmt) == FLOAT32:
        return "failed verify: it does not match eager elementwise"
    return "failed verify: outside the accuracy budget the export recorded (or did not run)"


def _why(best: dict[str, Any], verified: int, excluded: list[dict[str, Any]]) -> str:
    """One sentence: what was chosen, on what measurement, and what was left out."""
    precision = precision_of(best["format"])
    text = (
        f"{best['backend']} ({best['format']}, {precision}) is the fastest at batch {BATCH} "
        f"({best['median_ms']:.3f} ms median) of the {verified} backend(s) that passed verify"
    )
    if precision != FLOAT32:
        text += ", within the accuracy budget the export recorded"
    if excluded:
        text += "; left out: " + ", ".join(f"{e['backend']} ({e['why']})" for e in excluded)
    return text


def read_fastest(path: Path) -> dict[str, dict[str, Any]]:
    """The entries in PATH; {} when there is no file or it is not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        log.warning("%s cannot be read (%s); writing it anew", path, err)
        return {}
    if not isinstance(data, Mapping):
        log.warning("%s is not a JSON object; writing it anew", path)
        return {}
    return {str(k): dict(v) for k, v in data.items() if isinstance(v, Mapping)}


def write_fastest(path: Path, measured: Mapping[str, dict[str, Any] | None]) -> Path:
    """Merge MEASURED (model → entry) into PATH, atomically.

    A model measured now with no verified backend loses its old entry: that
    choice was made on an export or a machine this run no longer vouches for.
    """
    entries = read_fastest(path)
    for model, entry in measured.items():
        if entry is None:
            entries.pop(model, None)
        else:
            entries[model] = entry
    return write_json(Path(path), entries)
