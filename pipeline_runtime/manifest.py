"""`manifest.json`, typed: what an export folder holds, how it was made, and its I/O contract.

Export is the only writer. Everything downstream (verify, bench, archive,
serve, the handlers inside a `.mar`, the C++ client's callers) reads it
through `Manifest.read`, which checks the schema and the fields it needs, and
says "re-export" for anything it cannot read. Each small class owns its JSON
(as model-archiver's `manifest_components` do); the JSON keys are the ones
schema 1 used, so schema-1 manifests still load.

Pure Python (no torch): the handlers import it inside a TorchServe worker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SCHEMA = "pipeline.manifest/2"
# Schema 1 has the same fields; it loads as it is.
READABLE_SCHEMAS = ("pipeline.manifest/1", SCHEMA)
MANIFEST_NAME = "manifest.json"
GOLDEN_KEY = "golden"
PROBES_KEY = "probes"
# The golden inputs again, as numpy arrays in an .npz (no pickle): what a torch-free
# KServe worker warms up on, as it cannot read golden.pt without torch.
WARMUP_KEY, WARMUP_FILE = "warmup", "warmup.npz"


class ManifestError(ValueError):
    """A manifest that is missing, unreadable or not one this version understands."""


def _need(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping) or key not in data:
        raise ManifestError(f"the manifest's {where} has no {key!r} field")
    return data[key]


@dataclass(frozen=True)
class TensorRecord:
    """One input or output: a name, a shape (a str is a named dynamic axis), a dtype name.
    `low`/`high`: the range random inputs are drawn from (inputs only; `high` exclusive for
    integers, as torch.randint); `bounded`: the servers refuse an integer input outside it
    (token ids, `request.check_range`)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str
    low: float | None = None
    high: float | None = None
    bounded: bool = False

    @property
    def batch_axis(self) -> int | None:
        return self.shape.index("batch") if "batch" in self.shape else None

    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    def to_json(self) -> dict[str, Any]:
        out = self.describe()
        if self.low is not None:
            out["low"] = self.low
        if self.high is not None:
            out["high"] = self.high
        if self.bounded:
            out["bounded"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorRecord:
        shape = tuple(_need(data, "shape", "tensor record"))
        if not all(isinstance(d, int | str) and not isinstance(d, bool) for d in shape):
            raise ManifestError(f"tensor {data.get('name')!r} has a bad shape {list(shape)}")
        return cls(
            name=str(_need(data, "name", "tensor record")),
            shape=shape,
            dtype=str(_need(data, "dtype", "tensor record")),
            low=None if data.get("low") is None else float(data["low"]),
            high=None if data.get("high") is None else float(data["high"]),
            bounded=bool(data.get("bounded", False)),
        )


@dataclass(frozen=True)
class ArtifactRecord:
    """One file of the export: its format, its sha256 and how it was made.

    `details` holds what only its format knows (TorchScript's method, ONNX's
    exporter and opset, the .pt2's device and compile time); it is written
    flat beside the common fields, as schema 1 did.
    """

    file: str
    format: str
    sha256: str
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def how(self) -> str:
        """The method or exporter that produced it, in words."""
        return str(self.details.get("method") or self.details.get("exporter") or self.format)

    def get(self, key: str, default: Any = None) -> Any:
        return self.details.get(key, default)

    @property
    def outside_budget(self) -> bool:
        """An int8/float16 file export judged outside its accuracy budget: kept for
        inspection and listed under the manifest's `failed` too (never served)."""
        return bool(self.details.get("outside_budget"))

    def to_json(self) -> dict[str, Any]:
        out = {**self.details, "file": self.file, "format": self.format, "sha256": self.sha256}
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArtifactRecord:
        common = {"file", "format", "sha256", "reason"}
        return cls(
            file=str(_need(data, "file", "artifact record")),
            format=str(data.get("format", "")),
            sha256=str(_need(data, "sha256", "artifact record")),
            reason=str(data.get("reason", "")),
            details={k: v for k, v in data.items() if k not in common},
        )


@dataclass(frozen=True)
class ModelRecord:
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    task: str | None = None
    source: str = "zoo"  # "zoo", "torchvision" or "user"
    file: str | None = None  # absolute path of a file.py:Class model
    init: str = "trained"  # "trained", "imported" or "random"
    # What was done beyond the init itself, in words: for "random", the
    # normalisation statistics calibrated and the output scale reached.
    init_note: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "kwargs": self.kwargs,
            "task": self.task,
            "source": self.source,
            "init": self.init,
        }
        if self.file:
            out["file"] = self.file
        if self.init_note:
            out["init_note"] = self.init_note
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelRecord:
        return cls(
            name=str(_need(data, "name", "model")),
            kwargs=dict(data.get("kwargs") or {}),
            task=data.get("task"),
            source=str(data.get("source", "zoo")),
            file=data.get("file"),
            init=str(data.get("init", "trained")),
            init_note=str(data.get("init_note", "")),
        )


@dataclass(frozen=True)
class CheckpointRef:
    path: str  # relative to the export folder
    sha256: str
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "metrics": self.metrics}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointRef:
        return cls(
            path=str(_need(data, "path", "checkpoint")),
            sha256=str(_need(data, "sha256", "checkpoint")),
            metrics=dict(data.get("metrics") or {}),
        )


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def to_json(self) -> dict[str, float]:
        return {"atol": self.atol, "rtol": self.rtol}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tolerance:
        return cls(float(_need(data, "atol", "tolerance")), float(_need(data, "rtol", "tolerance")))


@dataclass(frozen=True)
class Serving:
    """What serving needs beyond tensors."""

    image_size: int | None = None  # PNG/JPEG requests accepted, resized to this (digits: 28)
    topk: int = 0  # classifiers: the k most likely classes beside the raw outputs
    # False for models whose output for one sample depends on the rest of the
    # batch (the tutorial gate sums over it): never stacked across clients.
    stack_requests: bool = True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.image_size is not None:
            out["image"] = {"size": self.image_size}
        if self.topk:
            out["topk"] = self.topk
        if not self.stack_requests:
            out["stack_requests"] = False
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Serving:
        image = data.get("image")
        return cls(
            image_size=int(image["size"]) if isinstance(image, Mapping) else None,
            topk=int(data.get("topk", 0)),
            stack_requests=bool(data.get("stack_requests", True)),
        )


@dataclass(frozen=True)
class Manifest:
    model: ModelRecord
    inputs: tuple[TensorRecord, ...]
    outputs: tuple[TensorRecord, ...]
    tolerance: Tolerance
    checkpoint: CheckpointRef
    artifacts: dict[str, ArtifactRecord]
    serving: Serving = field(default_factory=Serving)
    mode: str = "eval"
    created: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    schema: str = SCHEMA
    # Formats export was asked for but could not write, or wrote outside their accuracy
    # budget: format key → why, in one line. The export holds the others (`pipeline
    # export` exits 3); an outside-budget file stays in `artifacts` too, marked
    # `outside_budget`, for inspection. Absent from the JSON when empty, so older
    # manifests and readers are unaffected.
    failed: dict[str, str] = field(default_factory=dict)
    # Per-sample outputs (a detector's boxes, scores, labels per image): their fields, which
    # every artifact answers concatenated over the batch with a last output `counts`
    # (pipeline_runtime/outputs.py). Empty for every other model, and absent from the JSON.
    per_sample: tuple[str, ...] = ()

    @property
    def unwritten(self) -> dict[str, str]:
        """The failed formats that have no file (key → why)."""
        return {k: v for k, v in self.failed.items() if k not in self.artifacts}

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    def input_specs(self, key: str) -> tuple[TensorRecord, ...]:
        """The inputs as artifact `key` takes them: an axis it was compiled at one size
        for (`fixed_axes`, from --fix-axis) is that size, so servers refuse other sizes
        with a 400 naming the shape instead of the artifact failing."""
        fixed = self.artifacts[key].details.get("fixed_axes") if key in self.artifacts else None
        if not fixed:
            return self.inputs
        return tuple(
            replace(i, shape=tuple(fixed.get(d, d) if isinstance(d, str) else d for d in i.shape))
            for i in self.inputs
        )

    def artifact(self, key: str) -> ArtifactRecord:
        try:
            return self.artifacts[key]
        except KeyError:
            why = f" (its export failed: {self.failed[key]})" if key in self.failed else ""
            raise ManifestError(f"the export has no {key!r} artifact{why}") from None

    def validate(self) -> None:
        """Raise `ManifestError` for a manifest no stage could use."""
        if not self.inputs:
            raise ManifestError("the manifest lists no inputs")
        if not self.outputs:
            raise ManifestError("the manifest lists no outputs")
        for group, records in (("input", self.inputs), ("output", self.outputs)):
            names = [r.name for r in records]
            if len(set(names)) != len(names):
                raise ManifestError(f"{group} names repeat: {names}")
        for key, record in self.artifacts.items():
            if "/" in record.file or record.file in ("", ".", ".."):
                raise ManifestError(
                    f"artifact {key!r} names a file outside the export: {record.file!r}"
                )
        if self.per_sample and [*self.per_sample, "counts"] != self.output_names:
            raise ManifestError(
                f"per-sample fields {list(self.per_sample)} and 'counts' must be the outputs, "
                f"in order; the manifest lists {self.output_names}"
            )
        both = sorted(
            k
            for k in set(self.failed) & set(self.artifacts)
            if not self.artifacts[k].outside_budget
        )
        if both:
            raise ManifestError(f"format(s) {both} are listed both as written and as failed")

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": self.schema,
            "created": self.created,
            "model": self.model.to_json(),
            "mode": self.mode,
            "checkpoint": self.checkpoint.to_json(),
            "inputs": [i.to_json() for i in self.inputs],
            "outputs": [o.to_json() for o in self.outputs],
            "tolerance": self.tolerance.to_json(),
            "serving": self.serving.to_json(),
            "artifacts": {k: a.to_json() for k, a in self.artifacts.items()},
            "versions": self.versions,
        }
        if self.failed:
            out["failed"] = dict(self.failed)
        if self.per_sample:
            out["per_sample"] = {"fields": list(self.per_sample), "counts": "counts"}
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        if not isinstance(data, Mapping):
            raise ManifestError("the manifest is not a JSON object")
        schema = data.get("format")
        if schema not in READABLE_SCHEMAS:
            raise ManifestError(
                f"its schema is {schema!r}; this version reads {', '.join(READABLE_SCHEMAS)}"
            )
        try:
            manifest = cls(
                model=ModelRecord.from_json(_need(data, "model", "top level")),
                inputs=tuple(TensorRecord.from_json(i) for i in _need(data, "inputs", "top level")),
                outputs=tuple(
                    TensorRecord.from_json(o) for o in _need(data, "outputs", "top level")
                ),
                tolerance=Tolerance.from_json(_need(data, "tolerance", "top level")),
                checkpoint=CheckpointRef.from_json(_need(data, "checkpoint", "top level")),
                artifacts={
                    str(k): ArtifactRecord.from_json(v)
                    for k, v in dict(_need(data, "artifacts", "top level")).items()
                },
                serving=Serving.from_json(data.get("serving") or {}),
                mode=str(data.get("mode", "eval")),
                created=str(data.get("created", "")),
                versions=dict(data.get("versions") or {}),
                schema=SCHEMA,
                failed={str(k): str(v) for k, v in dict(data.get("failed") or {}).items()},
                per_sample=tuple(
                    str(f) for f in dict(data.get("per_sample") or {}).get("fields", ())
                ),
            )
        except (TypeError, ValueError, AttributeError) as err:
            if isinstance(err, ManifestError):
                raise
            raise ManifestError(f"a field has the wrong type ({err})") from None
        manifest.validate()
        return manifest

    @classmethod
    def loads(cls, text: str | bytes) -> Manifest:
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ManifestError(f"it is not valid JSON ({err})") from None
        return cls.from_json(data)

    @classmethod
    def read(cls, export_dir: Path) -> Manifest:
        """`export_dir/manifest.json`; `ManifestError` says what is wrong with it."""
        path = Path(export_dir) / MANIFEST_NAME
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise ManifestError(f"{path} does not exist") from None
        return cls.loads(text)
