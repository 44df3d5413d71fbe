"""Calibration data for the int8 formats: representative inputs, checked before any export.

Static int8 quantisation fixes each activation's scale from the ranges it
sees on these inputs, so they must look like what the model will be served.
Where they come from, in order:

1. `--calibration FILE`: a `torch.save`'d list of input dicts (each one batch,
   `{name: tensor}`, loaded with `weights_only=True`), or an `.npz` holding one
   array per input name (the whole set, batch axis included, split here into
   batches of `BATCH`);
2. a zoo model with data: the first `CALIBRATION_SAMPLES` samples of its
   training split (never the validation split, on which the int8 model is then
   judged);
3. otherwise random inputs drawn from the input spec, with a warning: such a
   calibration is *synthetic*, and the manifest says so.

A file whose names, shapes or dtypes do not fit the model's input spec is
refused with the first problem named, before anything is written.
"""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.errors import InputSpecError
from pipeline.zoo.spec import Inputs, ZooEntry

log = logging.getLogger(__name__)

CALIBRATION_SAMPLES = 256  # the zoo's calibration split: this many training samples
BATCH = 32  # samples per calibration batch
SYNTHETIC_SEED = 4321
SYNTHETIC_BATCHES = 8  # of the spec's default sizes


@dataclass(frozen=True)
class Calibration:
    """Calibration batches and where they came from (recorded in the manifest)."""

    batches: list[Inputs]
    source: str  # "file", "zoo" or "synthetic"
    what: str  # in words, for the manifest and the log

    @property
    def synthetic(self) -> bool:
        return self.source == "synthetic"

    @property
    def samples(self) -> int:
        return sum(_batch_of(b) for b in self.batches)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "what": self.what,
            "batches": len(self.batches),
            "samples": self.samples,
        }
        if self.synthetic:
            out["synthetic"] = True
        return out


def _batch_of(inputs: Inputs) -> int:
    first = next(iter(inputs.values()))
    return int(first.shape[0]) if first.ndim else 1


def _bad(path: Path, what: str, entry: ZooEntry) -> InputSpecError:
    spec = ", ".join(
        f"{s.name}{s.describe_shape()}:{str(s.dtype).removeprefix('torch.')}" for s in entry.inputs
    )
    return InputSpecError(
        f"Calibration file {path}: {what}. It must hold inputs for {entry.name!r} ({spec}): a "
        "torch.save'd list of {name: tensor} dicts, one batch each, e.g. "
        f"[{{{entry.inputs[0].name!r}: tensor}}, ...], or an .npz with one array per input name."
    )


def _from_npz(path: Path, entry: ZooEntry) -> list[Inputs]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise _bad(path, f"cannot be read as .npz ({err})", entry) from None
    names = [s.name for s in entry.inputs]
    if sorted(arrays) != sorted(names):
        raise _bad(path, f"holds arrays {sorted(arrays)}, not {names}", entry)
    sizes = {n: (a.shape[0] if a.ndim else 0) for n, a in arrays.items()}
    if len(set(sizes.values())) != 1 or 0 in sizes.values():
        raise _bad(path, f"its arrays do not share a non-empty first axis ({sizes})", entry)
    total = next(iter(sizes.values()))
    tensors = {n: torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in names}
    return [{n: t[i : i + BATCH] for n, t in tensors.items()} for i in range(0, total, BATCH)]


def _from_torch(path: Path, entry: ZooEntry) -> list[Inputs]:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear error
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise _bad(
            path, f"cannot be loaded with torch.load(weights_only=True) ({first})", entry
        ) from None
    if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
        data = [data]  # one batch given as a bare dict
    if not isinstance(data, list | tuple) or not data:
        raise _bad(path, f"holds a {type(data).__name__}, not a non-empty list of dicts", entry)
    batches = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not all(
            isinstance(v, torch.Tensor) for v in item.values()
        ):
            raise _bad(path, f"item {i} is a {type(item).__name__}, not a {{name: tensor}}", entry)
        batches.append(dict(item))
    return batches


def load_file(path: Path, entry: ZooEntry) -> Calibration:
    """`--calibration FILE`, each batch checked against the input spec (InputSpecError)."""
    path = Path(path)
    if not path.is_file():
        raise InputSpecError(f"Calibration file {path} does not exist.")
    batches = _from_npz(path, entry) if path.suffix == ".npz" else _from_torch(path, entry)
    names = [s.name for s in entry.inputs]
    for i, batch in enumerate(batches):
        if sorted(batch) != sorted(names):
            raise _bad(path, f"batch {i} has inputs {sorted(batch)}, not {names}", entry)
        ordered = {n: batch[n] for n in names}  # forward() order, whatever the file's
        try:
            entry.check_inputs(ordered)
        except InputSpecError as err:
            raise _bad(path, f"batch {i}: {err}".rstrip("."), entry) from None
        batches[i] = ordered
    count = sum(_batch_of(b) for b in batches)
    return Calibration(batches, "file", f"{path.name}: {len(batches)} batches, {count} samples")


def from_training_split(entry: ZooEntry) -> Calibration | None:
    """The zoo model's calibration split: the first CALIBRATION_SAMPLES training samples."""
    if entry.source != "zoo" or entry.task is None:
        return None
    from torch.utils.data import DataLoader, Subset

    from pipeline.train.tasks import get_task

    task = get_task(entry.task)
    train, _ = task.datasets(entry.name)
    count = min(CALIBRATION_SAMPLES, len(train))  # type: ignore[arg-type]
    names = [s.name for s in entry.inputs]
    batches = []
    for raw in DataLoader(Subset(train, range(count)), batch_size=BATCH, shuffle=False):
        inputs, _ = task.prepare(raw)
        batches.append(dict(zip(names, inputs, strict=True)))
    what = f"the first {count} samples of the {task.name} training split"
    return Calibration(batches, "zoo", what)


def synthetic(entry: ZooEntry) -> Calibration:
    """Random inputs from the input spec: a stand-in, recorded and warned about."""
    gen = torch.Generator().manual_seed(SYNTHETIC_SEED)
    batches = [entry.sample_inputs(entry.sizes(), gen) for _ in range(SYNTHETIC_BATCHES)]
    ranges = ", ".join(f"{s.name} in [{s.low:g}, {s.high:g})" for s in entry.inputs)
    what = f"random inputs from the input spec ({ranges}), seed {SYNTHETIC_SEED}"
    return Calibration(batches, "synthetic", what)


def calibration_for(entry: ZooEntry, path: Path | None) -> Calibration:
    """FILE when given, else the zoo's split, else synthetic inputs (with a warning)."""
    if path is not None:
        return load_file(path, entry)
    found = from_training_split(entry)
    if found is not None:
        return found
    made = synthetic(entry)
    log.warning(
        "calibrating %s on SYNTHETIC data: %s. Activation ranges taken from random inputs "
        "may not match real ones; pass --calibration FILE with real inputs. The manifest "
        "records the calibration as synthetic.",
        entry.name,
        made.what,
    )
    return made
