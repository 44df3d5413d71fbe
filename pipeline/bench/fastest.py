"""`fastest.json`: each model's fastest verified backend, as bench measured it.

Bench writes its own results and never edits an export (export is the
manifest's only writer). The file sits beside bench.json and maps each
model, as bench was given it ("digits_lenet", "torchvision:resnet18"), to
its fastest verified backend at batch 1 and the registry format that backend
runs, which is what `pipeline archive` reads to package one format:

    {"digits_lenet": {"backend": "onnxruntime", "format": "onnx", "median_ms": 0.04,
                      "batch": 1, "ranking": ["onnxruntime", "cpp", ...],
                      "measured": "2025-01-01T00:00:00+00:00"}}

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

log = logging.getLogger(__name__)

FASTEST_NAME = paths.fastest_path(Path(".")).name  # the file `pipeline archive` reads
BATCH = 1  # ranked at batch 1: one request's latency, what a served model answers


def fastest_of(cells: list[dict[str, Any]], *, exclude_suffix: str = "") -> dict[str, Any] | None:
    """The fastest verified backend at batch 1 among one model's CELLS (bench.json rows), or
    None when none was verified. Backends ending in `exclude_suffix` are not candidates."""
    ranked = sorted(
        (
            c
            for c in cells
            if c["batch"] == BATCH
            and c.get("verified")
            and c.get("format")
            and not (exclude_suffix and c["backend"].endswith(exclude_suffix))
        ),
        key=lambda c: c["median_ms"],
    )
    if not ranked:
        return None
    best = ranked[0]
    return {
        "backend": best["backend"],
        "format": best["format"],
        "median_ms": round(best["median_ms"], 4),
        "batch": BATCH,
        "ranking": [c["backend"] for c in ranked],
        "measured": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


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
