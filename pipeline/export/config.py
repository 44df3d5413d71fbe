"""`ExportConfig`: what `pipeline export` is asked to do, built from the command line in one place."""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core import paths
from pipeline.core.budget import DEFAULT_ACCURACY_BUDGET, Budget
from pipeline.core.defaults import DEFAULT_ATOL, DEFAULT_MODEL, DEFAULT_RTOL
from pipeline.core.errors import ExportError
from pipeline.formats import base as registry
from pipeline.formats.base import DEFAULT_OPSET, METHODS
from pipeline.formats.pt2 import Pt2Device
from pipeline.formats.torchscript import Method
from pipeline.zoo.spec import TensorSpec
from pipeline_runtime import jitgate

log = logging.getLogger("pipeline.export")

# The formats `pipeline export --format` offers, what "all" means (every float32
# format) and "precision" (every int8/float16 one), and the ones written without
# --format: all from the registry (pipeline/formats/).
# When this torch refuses `torch.jit` (TorchScript's sunset, pipeline_runtime/jitgate.py),
# "all" and the defaults leave TorchScript out, and .pt2 takes its place among the
# defaults; a format named on its own is still tried, and fails saying why.
KNOWN_FORMATS: tuple[str, ...] = registry.keys()
_JIT_REFUSED = bool(jitgate.refused())
FORMATS: tuple[str, ...] = registry.full_precision_keys()
PRECISION_FORMATS: tuple[str, ...] = registry.reduced_precision_keys()
DEFAULT_FORMATS: tuple[str, ...] = registry.default_keys()
if _JIT_REFUSED:
    FORMATS = registry.without_jit(FORMATS)
    DEFAULT_FORMATS = registry.without_jit(DEFAULT_FORMATS, defaults=True)


def _unavailable(keys: set[str]) -> set[str]:
    """The formats among `keys` (asked for through a group such as `all`) that need what is
    not installed here, each left out with one line; a format named on its own is tried and
    fails saying what to install."""
    left_out = set()
    for key in sorted(keys):
        fmt = registry.get(key)
        why = fmt.missing() if fmt.missing else None
        if why:
            log.info("--format all leaves %s out: %s", fmt.title, why)
            left_out.add(key)
    return left_out


@dataclass
class ExportConfig:
    model: str = DEFAULT_MODEL
    checkpoint: Path | None = None  # default: artifacts/<model>/checkpoint.pt
    # `checkpoint` is that default (no --checkpoint given): the CLI fills the path in with
    # its --artifacts-dir, and a model with nothing to train may then make it.
    checkpoint_default: bool = False
    out_dir: Path | None = None  # default: artifacts/<model>/export
    formats: tuple[str, ...] = DEFAULT_FORMATS
    method: Method = "auto"
    pt2_device: Pt2Device = "cpu"
    # Dynamic axes the .pt2 formats are compiled at one size (--fix-axis seq=32): the way
    # out when torch.export cannot keep an axis dynamic (docs/export.md).
    fix_axes: dict[str, int] = field(default_factory=dict)
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
    # The reduced-precision formats (int8, float16): representative inputs for static
    # quantisation (pipeline/export/calibration.py says what the default is) and the
    # budget they are held to, recorded in the manifest for verify, bench and serve.
    calibration: Path | None = None
    accuracy_budget: float = DEFAULT_ACCURACY_BUDGET
    min_sqnr: float | None = None  # dB; None: the precision's default
    # The .pt2 formats' AOTInductor settings: {"changes": ..., "from": ...}; empty, the
    # built-in ones (the CLI reads bench's sweep for this machine: pipeline/bench/pt2settings.py).
    pt2_settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, *, inputs: list | None = None, outputs: list | None = None
    ) -> ExportConfig:
        """The config `pipeline export` ARGS describe (inputs/outputs parsed by the CLI)."""
        from pipeline.zoo.user import parse_kwargs

        chosen = args.format or ()
        groups = {registry.ALL: FORMATS, registry.ALL_PRECISION: PRECISION_FORMATS}
        if not chosen:
            formats = DEFAULT_FORMATS
        else:  # in registry order, once each; a group stands for its formats
            asked = {k for c in chosen for k in groups.get(c, (c,))}
            asked -= _unavailable(asked - set(chosen))  # a group leaves out what cannot run
            known = registry.keys()  # now: a format registered after import counts
            formats = tuple(k for k in known if k in asked) + tuple(
                k for k in dict.fromkeys(chosen) if k not in known and k not in groups
            )
        out_dir = args.out_dir or paths.export_dir(args.model, args.artifacts_dir)
        kwargs = None if args.model_kwargs is None else parse_kwargs(args.model_kwargs)
        if inputs is None:
            inputs, outputs, kwargs = as_recorded(args.model, out_dir, outputs, kwargs)
        return cls(
            model=args.model,
            model_kwargs=kwargs or {},
            inputs=inputs,
            outputs=outputs,
            probes_file=args.probes,
            weights=args.weights,
            random_init=args.random_init,
            seed=args.seed,
            checkpoint=args.checkpoint or paths.checkpoint_path(args.model, args.artifacts_dir),
            checkpoint_default=args.checkpoint is None,
            out_dir=out_dir,
            formats=formats,
            pt2_device=args.pt2_device,
            fix_axes=parse_fix_axes(getattr(args, "fix_axis", None) or ()),
            method=args.method,
            allow_unsafe_trace=args.allow_unsafe_trace,
            opset=args.opset,
            atol=args.atol,
            rtol=args.rtol,
            calibration=args.calibration,
            accuracy_budget=args.accuracy_budget,
            min_sqnr=args.min_sqnr,
            pt2_settings=_pt2_settings(args.artifacts_dir),
        )

    @property
    def budget(self) -> Budget:
        return Budget(self.accuracy_budget, self.min_sqnr)

    def validate(self) -> None:
        known = registry.keys()
        unknown = [f for f in self.formats if f not in known]
        if unknown or not self.formats:
            raise ExportError(
                f"Unknown --format {', '.join(unknown) or '(none)'}; use one or more of "
                f"{', '.join(known)}, all (every float32 format) or precision (every "
                "int8/float16 one), e.g. --format torchscript --format onnx_int8_static."
            )
        self.budget.validate()
        # Said here, once per process, because every export passes here: what this torch's
        # refusal of torch.jit changes (the defaults and --format all, chosen at import).
        jitgate.say_once(
            log,
            "TorchScript is left out of the defaults and of --format all, and .pt2 takes "
            "its place among the defaults",
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
        for axis, size in self.fix_axes.items():
            if not isinstance(size, int) or size < 1:
                raise ExportError(f"--fix-axis {axis}={size}: the size must be at least 1.")
        if self.weights is not None and self.random_init:
            raise ExportError("Give either --weights or --random-init, not both.")


def _digits(text: str) -> bool:
    # ASCII only: "²" passes isdigit() and fails int().
    return text.isascii() and text.isdigit()


def parse_fix_axes(values: Any) -> dict[str, int]:
    """["seq=32"] → {"seq": 32}, or an error that shows the form."""
    out: dict[str, int] = {}
    for value in values:
        axis, sep, size = str(value).partition("=")
        if not sep or not axis.strip() or not _digits(size.strip()) or int(size) < 1:
            raise ExportError(
                f"--fix-axis {value!r}: write AXIS=N with a named dynamic axis and a size of at "
                "least 1, e.g. --fix-axis seq=32."
            )
        out[axis.strip()] = int(size)
    return out


def as_recorded(
    model: str, out_dir: Path, outputs: list[str] | None, kwargs: dict[str, Any] | None
) -> tuple[list[TensorSpec] | None, list[str] | None, dict[str, Any] | None]:
    """A user's model exported again without --input: the inputs its last export into
    `out_dir` recorded, and its output names and --model-kwargs unless given again, so that
    the second export of `file.py:Class` needs only --model, as verify, archive and serve do."""
    from pipeline.zoo.user import recorded_inputs
    from pipeline_runtime.manifest import Manifest, ManifestError

    if not paths.is_external(model) or model.startswith("torchvision:"):
        return None, outputs, kwargs  # a zoo or torchvision model has its inputs already
    try:
        manifest = Manifest.read(out_dir)
    except (OSError, ManifestError):
        return None, outputs, kwargs  # nothing recorded: "its inputs must be given"
    same = paths.model_slug(manifest.model.name) == paths.model_slug(model)
    if manifest.model.source != "user" or not manifest.inputs or not same:
        return None, outputs, kwargs  # another model's export there: refused later, saying so
    inputs = recorded_inputs(manifest)
    settings = [f"--input {_flag(spec)}" for spec in inputs]
    if kwargs is None and manifest.model.kwargs:
        kwargs = dict(manifest.model.kwargs)
        settings.append(f"--model-kwargs {shlex.quote(json.dumps(kwargs))}")
    if not outputs:
        outputs = manifest.output_names
        settings += [f"--output {name}" for name in outputs]
    log.info(
        "settings as %s/manifest.json records them: %s (give --input to change them)",
        out_dir,
        " ".join(settings),
    )
    return inputs, outputs, kwargs


def _flag(spec: TensorSpec) -> str:
    """SPEC as its --input value (NAME:DTYPE:SHAPE, and LOW:HIGH for a declared id range)."""
    text = f"{spec.name}:{str(spec.dtype).removeprefix('torch.')}:{','.join(map(str, spec.shape))}"
    # A range given for a float input is recorded (random inputs are drawn from it) but
    # not `bounded` (that is integer ids only): said whenever it is not the default.
    from pipeline.zoo.user import _default_range  # what --input draws from unless told

    ranged = spec.bounded or (spec.low, spec.high) != _default_range(spec.dtype)
    return f"{text}:{spec.low:g}:{spec.high:g}" if ranged else text


def _pt2_settings(artifacts_dir: Path | None) -> dict[str, Any]:
    """bench's AOTInductor settings for this machine (the .pt2 formats compile with them)."""
    from pipeline.core.pt2settings import for_export

    changes, why = for_export(paths.bench_dir(artifacts_dir))
    return {"changes": changes, "from": why}
