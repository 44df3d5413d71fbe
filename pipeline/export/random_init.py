"""`--random-init`: seeded random weights whose outputs are of a realistic scale, or a warning.

A freshly built model keeps its normalisation layers' running statistics at
mean 0 / variance 1, while the activations reaching them after random
initialisation shrink (or grow) layer by layer. In eval mode nothing corrects
that: torchvision's mobilenet_v3_small answers with logits of about 2e-9,
and a parity check on outputs that small proves nothing. So the running
statistics are calibrated the way `torch.optim.swa_utils.update_bn` does it
after weight averaging: reset, momentum None (a plain cumulative average),
a few forward passes under `torch.no_grad()` with those layers in train mode,
here on seeded random inputs drawn from the model's input spec. The rest of
the model stays in eval mode, so Dropout does not add noise to the statistics.

What was done, and the largest |output| the model then gives on the golden
inputs, go into the checkpoint's sidecar and the manifest. When that scale is
still below `TINY_OUTPUT` the export warns, saying why. (mobilenet_v3_small
then reaches about 0.02, not more: torchvision initialises its classifier's
two Linear layers with N(0, 0.01), and average pooling of features of random,
spatially uncorrelated images divides their scale by about 6; resnet18 reaches 1.5.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from pipeline.core.compare import VACUOUS_FRACTION
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline_runtime.outputs import flatten_outputs

log = logging.getLogger(__name__)

# Forward passes and their batch size for the calibration: 32 samples settle
# the statistics of every torchvision classifier tried (mobilenet_v3_small's
# logits moved by under 10% between 4×8 and 8×16) in well under a second
# for mobilenet_v3_small, about one for resnet18 on two cores.
CALIBRATION_BATCHES = 4
CALIBRATION_BATCH_SIZE = 8
# Below this largest |output| on the golden inputs a random-init export warns:
# absolute errors of float32 kernels (1e-7..1e-5) are then a sizeable part of
# the signal, and verify's default atol 1e-5 is a tenth of it at 1e-4.
TINY_OUTPUT = 1e-3


@dataclass(frozen=True)
class Calibration:
    """What `initialise` did to the model's normalisation statistics, and the scale it reached."""

    layers: int  # normalisation layers with running statistics (0: nothing to calibrate)
    batches: int  # forward passes run (0: none)
    batch_size: int
    output_max_abs: float | None  # max |output| on the golden inputs; None if it could not run
    problem: str = ""  # why calibration was skipped or abandoned
    after: str = ""  # what the zoo entry did next (ZooEntry.after_random_init)

    @property
    def note(self) -> str:
        """One line for the manifest: what was done and the scale reached."""
        if self.layers == 0:
            done = "no normalisation layers with running statistics to calibrate"
        elif self.problem:
            done = f"normalisation statistics NOT calibrated ({self.problem})"
        else:
            done = (
                f"{self.layers} normalisation layers' running statistics calibrated on "
                f"{self.batches} random batches of {self.batch_size} from the input spec"
            )
        if self.after:
            done = f"{done}; {self.after}"
        if self.output_max_abs is None:
            return done
        return f"{done}; max |output| on the golden inputs {self.output_max_abs:.3g}"

    def to_json(self) -> dict[str, Any]:
        return {
            "norm_layers": self.layers,
            "batches": self.batches,
            "batch_size": self.batch_size,
            "output_max_abs": self.output_max_abs,
            **({"problem": self.problem} if self.problem else {}),
            **({"after": self.after} if self.after else {}),
        }


def norm_layers(model: nn.Module) -> list[_NormBase]:
    """BatchNorm*, SyncBatchNorm and InstanceNorm* layers that keep running statistics."""
    return [
        m
        for m in model.modules()
        if isinstance(m, _NormBase) and m.track_running_stats and m.running_mean is not None
    ]


def calibrate(model: nn.Module, entry: ZooEntry, generator: torch.Generator) -> Calibration:
    """Recompute the running statistics of `model`'s normalisation layers on random batches.

    Leaves `model` in eval mode. If a forward pass fails (an input spec the model
    rejects in train mode, a batch of one per channel), the statistics are put
    back as they were and the reason is returned in `problem`.
    """
    layers = norm_layers(model)
    if not layers:
        model.eval()  # as promised: ssd300_vgg16, with no BatchNorm, failed in train mode
        return Calibration(0, 0, 0, None)
    buffers = ("running_mean", "running_var", "num_batches_tracked")
    saved = [
        (m, m.momentum, {b: getattr(m, b).clone() for b in buffers if getattr(m, b) is not None})
        for m in layers
    ]
    model.eval()
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches, not a moving one
            m.train()
        with torch.no_grad():
            for _ in range(CALIBRATION_BATCHES):
                batch = entry.sample_inputs(entry.sizes(batch=CALIBRATION_BATCH_SIZE), generator)
                model(*batch.values())
    except Exception as err:  # noqa: BLE001 - any failure: keep the model as it was built
        for m, _, values in saved:
            for name, value in values.items():
                getattr(m, name).copy_(value)
        problem = f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
        return Calibration(len(layers), 0, CALIBRATION_BATCH_SIZE, None, problem)
    finally:
        for m, momentum, _ in saved:
            m.momentum = momentum
        model.eval()
    return Calibration(len(layers), CALIBRATION_BATCHES, CALIBRATION_BATCH_SIZE, None)


def output_scale(model: nn.Module, inputs: Inputs) -> float | None:
    """The largest finite |value| among the model's floating-point outputs on `inputs`."""
    try:
        with torch.no_grad():
            outputs = flatten_outputs(model(*inputs.values()))
    except Exception:  # noqa: BLE001 - export reports a model that rejects its inputs itself
        return None
    values = [
        t.detach().abs()[torch.isfinite(t)].max()
        for t in outputs
        if t.is_floating_point() and torch.isfinite(t).any()
    ]
    return float(max(values)) if values else None


def initialise(
    entry: ZooEntry, seed: int, golden: Inputs, *, atol: float, rtol: float
) -> tuple[nn.Module, Calibration]:
    """The model built with seed `seed`, its normalisation statistics calibrated (eval mode).

    Deterministic: the same seed gives the same weights and statistics. Warns
    when the outputs on the golden inputs stay below `TINY_OUTPUT`.
    """
    torch.manual_seed(seed)
    model = entry.build()
    done = calibrate(model, entry, torch.Generator().manual_seed(seed))
    after = entry.after_random_init(model, golden) if entry.after_random_init else ""
    scale = output_scale(model, golden)
    done = Calibration(done.layers, done.batches, done.batch_size, scale, done.problem, after)
    if scale is not None and scale < TINY_OUTPUT:
        log.warning(tiny_output_warning(entry.name, done, atol=atol, rtol=rtol))
    return model, done


def tiny_output_warning(name: str, done: Calibration, *, atol: float, rtol: float) -> str:
    """Why the random-init outputs of `name` stay tiny, and what verify makes of that."""
    if done.layers == 0:
        why = (
            "it has no normalisation layers with running statistics to calibrate, and its "
            "random initialisation shrinks the activations layer by layer"
        )
    elif done.problem:
        why = f"its normalisation statistics could not be calibrated ({done.problem})"
    else:
        why = (
            f"even with its {done.layers} normalisation layers calibrated on {done.batches} "
            "random batches: the randomly initialised layers after them shrink the signal"
        )
    # verify calls a check vacuous when atol + rtol * max|ref| >= VACUOUS_FRACTION * max|ref|.
    floor = atol / (VACUOUS_FRACTION - rtol) if rtol < VACUOUS_FRACTION else float("inf")
    return (
        f"--random-init: {name!r} reaches only max |output| {done.output_max_abs:.2g} on the "
        f"golden inputs (below the {TINY_OUTPUT:g} this export calls realistic), because {why}. Outputs this "
        f"small cannot show a wrong backend: verify refuses tolerances that cannot tell them "
        f"from zeros (at atol {atol:g}, rtol {rtol:g}: any output below {floor:.2g}). Export "
        "trained weights with --weights FILE for a meaningful parity check."
    )
