"""The task-level verdict of a reduced-precision artifact, as export measures and verify checks it.

Which rule judges a model (docs/verification.md):

- **accuracy**: a zoo model whose task has labelled data (the digits): accuracy
  on the validation split, eager float32 against the backend. The *drop* in
  points must stay within the accuracy budget (default 0.5); top-1 agreement
  is reported beside it.
- **agreement**: a classifier without data (torchvision, a user model with
  `topk`): top-1 agreement with eager on the golden, probe and random inputs.
  The disagreement, in points, must stay within the same budget.
- Both classifier rules also hold the scores: the SQNR of the classifier's output
  on the same samples must reach the precision's minimum, as for `sqnr` below
  (`pipeline.core.tasklevel.score_bound`). Right decisions with far-off scores fail.
- **sqnr**: anything else: the signal-to-quantisation-noise ratio of each
  output, 10·log10(Σref² / Σ(ref − got)²) pooled over those inputs, must reach
  the minimum (default by precision, `pipeline.core.budget.DEFAULT_MIN_SQNR_DB`).

Every bound must be able to fail: a budget that a model answering at chance
would meet, or a minimum SQNR of 0 dB or less (all zeros score 0 dB), fails as
*vacuous* instead of passing (pipeline.core.verdict.held).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.budget import Budget
from pipeline.core.errors import PipelineError
from pipeline.core.tasklevel import Run, judge_accuracy, judge_cases, quality_record
from pipeline.core.verdict import ACCURACY, AGREEMENT, SQNR, Verdict
from pipeline.zoo.spec import Inputs, ZooEntry

log = logging.getLogger(__name__)

VALIDATION_BATCH = 128  # validation samples per forward pass


def random_cases(
    entry: ZooEntry, batch_sizes: Sequence[int] = (1, 7), seed: int = 0
) -> list[tuple[str, Inputs]]:
    """verify's fresh random inputs: one batch per size, then every other dynamic axis (a
    sequence length) at 1 and at 3× the example's size, lengths a program that baked the
    example's in gets wrong. Export measures on the same ones."""
    gen = torch.Generator().manual_seed(seed)
    cases = [(f"random b={b}", entry.sample_inputs(entry.sizes(batch=b), gen)) for b in batch_sizes]
    others = sorted(
        {d for s in entry.inputs for d in s.shape if isinstance(d, str) and d != "batch"}
    )
    for factor in (0, 3) if others else ():
        sizes = entry.sizes(**{a: max(1, factor * entry.sizes().get(a, 5)) for a in others})
        label = " ".join(f"{a}={sizes[a]}" for a in others)
        cases.append((f"random {label}", entry.sample_inputs(sizes, gen)))
    return cases


def rule_for(entry: ZooEntry, classifier: bool) -> str:
    """Which rule judges this model: see the module docstring."""
    if entry.source == "zoo" and entry.task is not None:
        from pipeline.train.tasks import get_task

        if get_task(entry.task).metric == "val_accuracy":
            return ACCURACY
    return AGREEMENT if classifier else SQNR


def validation_batches(
    entry: ZooEntry, batch: int = VALIDATION_BATCH, whole: bool = False
) -> list[tuple[Inputs, torch.Tensor]]:
    """The zoo model's validation split as (named inputs, labels) batches; `whole`: each of
    exactly `batch` samples, the remainder left out (for an artifact compiled at one batch
    size, --fix-axis batch=N)."""
    from torch.utils.data import DataLoader

    from pipeline.train.tasks import get_task

    if entry.task is None:
        raise PipelineError(f"{entry.name!r} has no task, so no validation split.")
    task = get_task(entry.task)
    _, val = task.datasets(entry.name)
    names = [s.name for s in entry.inputs]
    out = []
    for raw in DataLoader(val, batch_size=batch, shuffle=False, drop_last=whole):
        inputs, target = task.prepare(raw)
        out.append((dict(zip(names, inputs, strict=True)), target))
    return out


def validation_batch(record: Any) -> int:
    """The validation batch an artifact takes: VALIDATION_BATCH, or less where its record
    (a manifest record or its details) plans a smaller largest batch (an ExecuTorch
    program's `max_sizes`), or the one size it was compiled for (`fixed_axes`)."""
    fixed = (record.get("fixed_axes") or {}).get("batch")
    if fixed:
        return int(fixed)
    largest = (record.get("max_sizes") or {}).get("batch")
    return min(VALIDATION_BATCH, int(largest)) if largest else VALIDATION_BATCH


def batch_fixed(record: Any) -> bool:
    """Whether an artifact takes one batch size only (--fix-axis batch=N)."""
    return bool((record.get("fixed_axes") or {}).get("batch"))


def judge(
    entry: ZooEntry,
    classifier: bool,
    eager: Run,
    backend: Run,
    cases: Sequence[tuple[str, Inputs]],
    names: Sequence[str],
    precision: str,
    budget: Budget,
    validation: Sequence[tuple[Inputs, torch.Tensor]] | None = None,
    record: Any = None,
) -> list[Verdict]:
    """Every task-level verdict for one backend (one per output for SQNR, else one).

    `validation`: the validation batches, when the caller already loaded them
    (several backends share one load); else they are loaded in batches the artifact
    takes, read from its manifest `record` (`validation_batch`, `batch_fixed`).
    """
    rule = rule_for(entry, classifier)
    if rule == ACCURACY:
        if validation is None:
            record = record or {}
            validation = validation_batches(
                entry, validation_batch(record), whole=batch_fixed(record)
            )
        return judge_accuracy(eager, backend, validation, names, budget, precision)
    return judge_cases(rule, eager, backend, cases, names, precision, budget)


def measure(
    model: nn.Module,
    entry: ZooEntry,
    key: str,
    path: Path,
    precision: str,
    budget: Budget,
    cases: list[tuple[str, Inputs]],
    details: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The verdict of artifact `path` (format `key`) as the manifest keeps it: the rule,
    inputs and budget `pipeline verify` applies. None, with a warning, when the artifact
    cannot run here (a float16 graph ONNX Runtime's CPU provider refuses)."""
    from pipeline_runtime import runners
    from pipeline_runtime.outputs import name_outputs

    names = [s.name for s in entry.inputs]
    outputs = list(entry.outputs)
    try:
        # `details`: what the loader reads from the manifest record (a .pt2's device).
        runner = runners.load(key, path, inputs=names, outputs=outputs, record=details)
    except Exception as err:  # noqa: BLE001 - written all the same, unjudged, and said so
        log.warning(
            "%s cannot run here (%s): it is written but not judged; verify it where a "
            "runtime provider that runs it is available.",
            key,
            " ".join(str(err).split())[:300],
        )
        return None

    def eager(inputs: Inputs) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return name_outputs(model(*inputs.values()), outputs)

    classifier = bool(entry.serving.get("topk"))
    # Only the sizes the artifact takes, as verify runs it (`runs_on`): one compiled at a
    # fixed size (--fix-axis), or planned for largest sizes (an ExecuTorch program).
    record = details or {}
    fixed, largest = (dict(record.get(k) or {}) for k in ("fixed_axes", "max_sizes"))
    cases = [(label, c) for label, c in cases if entry.fits(c, fixed) and entry.within(c, largest)]
    verdicts = judge(
        entry, classifier, eager, runner, cases, outputs, precision, budget, record=record
    )
    for v in verdicts:
        if v.passed:
            log.info("%s: %s", key, v.describe())
        else:
            log.warning(
                "%s is OUTSIDE its budget: %s. It is written (and recorded as such in the "
                "manifest), but verify fails on it and serve will not choose it.",
                key,
                v.describe(),
            )
    return quality_record(verdicts, budget, precision)


__all__ = [
    "ACCURACY",
    "AGREEMENT",
    "SQNR",
    "Verdict",
    "batch_fixed",
    "judge",
    "measure",
    "random_cases",
    "rule_for",
    "validation_batch",
    "validation_batches",
]
