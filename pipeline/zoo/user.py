"""Models that are not in the zoo: users' own classes and torchvision classifiers.

`--model` accepts, besides a zoo name:

* ``package.module:ClassName``: imported from the Python path;
* ``path/to/file.py:ClassName``: imported from that file;
* ``torchvision:NAME``: ``torchvision.models.get_model(NAME, weights=None)``
  (random initialisation: weights are never downloaded; give a checkpoint with
  ``--weights``).

The input spec comes from ``--input NAME:DTYPE:SHAPE`` (repeatable; a name in
SHAPE marks a dynamic axis: ``image:float32:batch,3,32,32``) or from a YAML or
TOML file (``--input-spec``). Everything needed to rebuild the entry is
written into the export's manifest, so `verify` needs only ``--model``.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from pipeline.core.errors import InputArgumentError, InputSpecError, UnknownModelError
from pipeline.zoo import detection
from pipeline.zoo.spec import Inputs, TensorSpec, ZooEntry, parse_dtype
from pipeline.zoo.user_class import import_class
from pipeline_runtime.manifest import Manifest

TORCHVISION_PREFIX = "torchvision:"
TORCHVISION_INPUT = TensorSpec("image", ("batch", 3, 224, 224), low=-2.0, high=2.0)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_input(text: str) -> TensorSpec:
    """'image:float32:batch,3,32,32[:LOW:HIGH]' → TensorSpec.

    Names in the shape are dynamic axes; LOW:HIGH is the range random inputs
    are drawn from, high exclusive as in torch.randint (default -1:1 for
    floats, 0:10 for integers, i.e. 0..9, and 0:2 for bool). An integer input's
    LOW:HIGH, when given, is also the range the servers accept.
    """
    parts = text.split(":")
    if len(parts) not in (3, 5) or not all(parts):
        raise InputSpecError(
            f"Bad --input {text!r}: expected NAME:DTYPE:SHAPE[:LOW:HIGH], for example "
            "'image:float32:batch,3,32,32' or 'tokens:int64:batch,seq:0:1000' (a name in SHAPE "
            "marks a dynamic axis)."
        )
    name, dtype, shape = parts[:3]
    low, high = parts[3:] if len(parts) == 5 else (None, None)
    return _spec(name, dtype, shape.split(","), source=f"--input {text!r}", low=low, high=high)


def _default_range(dtype: torch.dtype) -> tuple[float, float]:
    if dtype == torch.bool:
        return 0.0, 2.0  # high exclusive: False and True
    if dtype.is_floating_point:
        return -1.0, 1.0
    return 0.0, 10.0  # integer inputs are often indices: 0..9, never negative by default


def _number(value: Any, what: str, source: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputSpecError(f"{source}: {what} must be a number, got {value!r}.") from None
    if not math.isfinite(number):
        raise InputSpecError(f"{source}: {what} must be finite, got {value!r}.")
    return number


def _spec(
    name: Any, dtype: Any, shape: Any, source: str, low: Any = None, high: Any = None
) -> TensorSpec:
    if not isinstance(shape, list | tuple):
        raise InputSpecError(
            f"{source}: 'shape' must be a list such as [batch, 3, 32, 32], got {shape!r}."
        )
    if not isinstance(name, str) or not _IDENT.match(name):
        raise InputSpecError(f"{source}: input name {name!r} must be a Python identifier.")
    dims: list[int | str] = []
    for d in shape:
        d = d.strip() if isinstance(d, str) else d
        if isinstance(d, str) and d.lstrip("-").isdigit():
            d = int(d)
        if isinstance(d, bool) or not isinstance(d, int | str):
            raise InputSpecError(f"{source}: shape entry {d!r} must be an integer or an axis name.")
        if isinstance(d, int) and d < 1:
            raise InputSpecError(f"{source}: dimension {d} must be at least 1.")
        if isinstance(d, str) and not _IDENT.match(d):
            raise InputSpecError(
                f"{source}: axis name {d!r} must be an identifier such as 'batch'."
            )
        dims.append(d)
    if not dims:
        raise InputSpecError(f"{source}: the shape of {name!r} is empty.")
    torch_dtype = parse_dtype(str(dtype))
    default_low, default_high = _default_range(torch_dtype)
    lo = default_low if low is None else _number(low, "low", source)
    hi = default_high if high is None else _number(high, "high", source)
    if lo > hi:
        raise InputSpecError(f"{source}: low ({lo}) must not exceed high ({hi}).")
    if not torch_dtype.is_floating_point and int(hi) <= int(lo):
        raise InputSpecError(
            f"{source}: integer range {lo:g}:{hi:g} is empty; high is exclusive (as in "
            f"torch.randint), so {int(lo)}:{int(lo) + 1} draws only {int(lo)}."
        )
    # An integer range the user declared is the values the model takes (an embedding of
    # 50 words is 0:50): the servers refuse others. A default one only draws samples.
    integer = torch_dtype != torch.bool and not torch_dtype.is_floating_point
    bounded = integer and low is not None and high is not None
    return TensorSpec(name, tuple(dims), torch_dtype, low=lo, high=hi, bounded=bounded)


def check_unique(specs: Sequence[TensorSpec]) -> None:
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputSpecError(
            f"Input name(s) {dupes} are given more than once; each input needs its own name."
        )


def check_order(builder: Any, specs: Sequence[TensorSpec]) -> None:
    """The inputs are passed to forward() by position: a name given at another position
    than forward()'s argument of that name is refused (--input b then --input a for
    forward(self, a, b) fed `a` the tensor named b: ONNX's input `b` was forward's `a`,
    and a server answering by name computed something else)."""
    try:
        params = list(inspect.signature(builder.forward).parameters.values())[1:]  # not self
    except (AttributeError, TypeError, ValueError):  # a factory, or no Python signature
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in params if p.kind in positional]
    for i, spec in enumerate(specs):
        if spec.name in names and names.index(spec.name) != i:
            raise InputSpecError(
                f"--input {spec.name!r} is given in place {i + 1}, but forward() takes "
                f"{spec.name!r} in place {names.index(spec.name) + 1}: inputs are passed by "
                f"position, so give them in forward()'s order ({', '.join(names)})."
            )


def load_spec_file(path: Path) -> tuple[list[TensorSpec], list[str]]:
    """Inputs (and optional output names) from a YAML or TOML file.

    inputs:
      - {name: image, dtype: float32, shape: [batch, 3, 32, 32], low: 0, high: 1}
    outputs: [logits]
    """
    path = Path(path)
    if not path.is_file():
        raise InputSpecError(f"Input spec file {path} does not exist.")
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise InputSpecError(f"Input spec file {path} cannot be parsed: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list) or not data["inputs"]:
        raise InputSpecError(
            f"Input spec file {path} needs a non-empty 'inputs' list, for example\n"
            "inputs:\n  - {name: image, dtype: float32, shape: [batch, 3, 32, 32]}"
        )
    specs = []
    for i, item in enumerate(data["inputs"]):
        if not isinstance(item, dict) or not {"name", "shape"} <= set(item):
            raise InputSpecError(
                f"{path}: inputs[{i}] needs 'name' and 'shape' (and optionally 'dtype')."
            )
        specs.append(
            _spec(
                item["name"],
                item.get("dtype", "float32"),
                item["shape"],
                f"{path}: inputs[{i}]",
                item.get("low"),
                item.get("high"),
            )
        )
    check_unique(specs)
    outputs = data.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise InputSpecError(f"{path}: 'outputs' must be a list of names.")
    return specs, outputs


# Sizes for every dynamic axis in the random probes: batch 1 and >1, and
# every other named axis (a sequence length, say) both shorter and longer
# than the export example, so a trace that baked a size in is caught.
PROBE_SIZES = (1, 3, 7)


def _random_probes(specs: tuple[TensorSpec, ...], sizes: Mapping[str, int]) -> Any:
    axes = sorted({d for s in specs for d in s.shape if isinstance(d, str)})

    def probes(generator: torch.Generator, model: nn.Module) -> list[tuple[str, Inputs]]:
        out = []
        for size in PROBE_SIZES:
            chosen = {a: size for a in axes}
            label = " ".join(f"{a}={n}" for a, n in chosen.items()) or "fixed shape"
            inputs = {s.name: s.sample({**sizes, **chosen}, generator) for s in specs}
            out.append((f"random {label}", inputs))
        return out

    return probes


def _file_probes(path: Path) -> Any:
    def probes(generator: torch.Generator, model: nn.Module) -> list[tuple[str, Inputs]]:
        return load_probes(path)

    return probes


def load_probes(path: Path) -> list[tuple[str, Inputs]]:
    """User probes: a `torch.save`d list of {name: tensor} dicts, or {label: {name: tensor}}."""
    path = Path(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputSpecError(f"Probe file {path} does not exist.") from None
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
        raise InputSpecError(
            f"Probe file {path} cannot be read with torch.load(weights_only=True): {str(err).splitlines()[0]}"
        ) from None
    if isinstance(data, dict):
        items = list(data.items())
    elif isinstance(data, list | tuple):
        items = [(f"user {i}", d) for i, d in enumerate(data)]
    else:
        raise InputSpecError(
            f"Probe file {path} holds a {type(data).__name__}; save a {{label: {{input name: tensor}}}} "
            "dict (or a list of {input name: tensor} dicts) with torch.save."
        )
    probes = []
    for label, inputs in items:
        if not isinstance(inputs, dict) or not all(
            isinstance(v, torch.Tensor) for v in inputs.values()
        ):
            raise InputSpecError(
                f"Probe file {path}: probe {label!r} must be a dict of input name → tensor."
            )
        probes.append((str(label), dict(inputs)))
    return probes


def external_entry(
    name: str,
    *,
    kwargs: Mapping[str, Any] | None = None,
    inputs: Sequence[TensorSpec] | None = None,
    outputs: Sequence[str] | None = None,
    probes_file: Path | None = None,
) -> ZooEntry:
    """A ZooEntry for a user class or a torchvision model."""
    kwargs = dict(kwargs or {})
    if name.startswith(TORCHVISION_PREFIX):
        arch = name.removeprefix(TORCHVISION_PREFIX)
        import torchvision

        known = torchvision.models.list_models(module=torchvision.models)
        if arch in detection.detector_names():
            return _detector_entry(name, arch, kwargs, inputs, outputs, probes_file)
        if arch not in known:
            raise UnknownModelError(
                f"Unknown torchvision model {arch!r}. Known classifiers: {', '.join(known[:12])}, "
                "… (torchvision.models.list_models()); detectors: "
                f"{', '.join(detection.detector_names()[:6])}, …"
            )

        def builder(**kw: Any) -> nn.Module:
            return torchvision.models.get_model(arch, weights=None, **kw)

        specs = tuple(inputs or (TORCHVISION_INPUT,))
        outputs = outputs or ("logits",)
        source = "torchvision"
        description = f"torchvision {arch} (random init unless --weights)"
    else:
        builder = import_class(name)
        if not inputs:
            raise InputArgumentError(
                f"Model {name!r} is not in the zoo, so its inputs must be given: "
                "--input NAME:DTYPE:SHAPE (for example --input x:float32:batch,16) "
                "or --input-spec spec.yaml."
            )
        specs = tuple(inputs)
        check_unique(specs)
        check_order(builder, specs)
        source = "user"
        description = f"user model {name}"
    sizes = {d: (2 if d == "batch" else 5) for s in specs for d in s.shape if isinstance(d, str)}
    return ZooEntry(
        name=name,
        description=description,
        builder=builder,
        kwargs=kwargs,
        inputs=specs,
        outputs=tuple(outputs or ()),
        task=None,
        default_sizes=sizes,
        probes=_file_probes(probes_file) if probes_file else _random_probes(specs, sizes),
        source=source,
        serving={"topk": 5} if source == "torchvision" else {},
        # A user's wrapper around a torchvision detector: spread its scores as for
        # `torchvision:<detector>` (does nothing to a model that holds none).
        after_random_init=detection.spread_inner_scores if source == "user" else None,
    )


def _detector_entry(
    name: str,
    arch: str,
    kwargs: dict[str, Any],
    inputs: Sequence[TensorSpec] | None,
    outputs: Sequence[str] | None,
    probes_file: Path | None,
) -> ZooEntry:
    """A torchvision detector (pipeline/zoo/detection.py): a batch tensor in, per-image
    detections out; requests are not stacked (each image's detections are its own)."""
    specs = tuple(inputs or (detection.native_input(arch, kwargs),))
    sizes = {d: 2 if d == "batch" else 5 for s in specs for d in s.shape if isinstance(d, str)}
    return ZooEntry(
        name=name,
        description=f"torchvision detector {arch} (random init unless --weights)",
        builder=lambda **kw: detection.build_detector(arch, **kw),
        kwargs=kwargs,
        inputs=specs,
        outputs=tuple(outputs or ()),  # export names them from the detector's own answer
        task=None,
        default_sizes=sizes,
        probes=_file_probes(probes_file) if probes_file else _random_probes(specs, sizes),
        source="torchvision",
        serving={"stack_requests": False},
        after_random_init=detection.spread_scores,
    )


def recorded_inputs(manifest: Manifest) -> list[TensorSpec]:
    """The inputs an export recorded, as `--input` would give them (ranges and whether the
    servers refuse ids outside them included)."""
    return [
        replace(_spec(i.name, i.dtype, list(i.shape), "manifest", i.low, i.high), bounded=i.bounded)
        for i in manifest.inputs
    ]


def entry_from_manifest(manifest: Manifest) -> ZooEntry:
    """Rebuild an external model's entry from what export recorded."""
    model = manifest.model
    where, _, cls = model.name.rpartition(":")
    name = model.name
    if where.endswith(".py") and not Path(where).is_file() and model.file:
        # Exported from another working directory: use the absolute path recorded then.
        name = f"{model.file}:{cls}"
    specs = recorded_inputs(manifest)
    entry = external_entry(name, kwargs=model.kwargs, inputs=specs, outputs=manifest.output_names)
    return replace(entry, name=model.name)


def parse_kwargs(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputSpecError(
            f"--model-kwargs must be a JSON object, e.g. '{{\"width\": 32}}': {err}"
        ) from None
    if not isinstance(value, dict):
        raise InputSpecError("--model-kwargs must be a JSON object, e.g. '{\"width\": 32}'.")
    return value
