"""The checks behind `pipeline verify`: every backend × input set × output against eager,
and, for a backend that fails, where it first departs (pipeline/verify/localise.py)."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.core import detections as detect
from pipeline.core.budget import Budget
from pipeline.core.compare import Comparison, Kind, compare_tensor
from pipeline.core.errors import InputSpecError, PipelineError, TooLargeError
from pipeline.export import quality as task
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.verify.backends import Backend
from pipeline.verify.report import DETECTIONS, GOLDEN_FILE_BACKEND, Row
from pipeline.zoo.spec import Inputs

log = logging.getLogger(__name__)

Case = tuple[str, Inputs, dict[str, torch.Tensor] | None]  # label, inputs, stored golden outputs
# Failures that say something about the numbers, and so can be localised.
LOCALISABLE = (Kind.TOLERANCE, Kind.NON_FINITE, Kind.SHAPE)


@dataclass(frozen=True)
class Tol:
    """The tolerance verify applies: fixed atol/rtol, or atol relative to each output's scale."""

    atol: float
    rtol: float
    atol_scale: float | None = None  # atol = atol_scale * max|ref|, per output and input set
    allow_vacuous: bool = False

    def atol_for(self, ref: torch.Tensor) -> float:
        if self.atol_scale is None or not ref.is_floating_point() or ref.numel() == 0:
            return self.atol
        finite = ref[ref.isfinite()]
        return self.atol_scale * float(finite.abs().max()) if finite.numel() else self.atol

    def compare(
        self, ref: torch.Tensor, got: torch.Tensor, classifier: bool
    ) -> tuple[Comparison, float]:
        """The comparison under verify's strict rules, and the atol it used."""
        atol = self.atol_for(ref)
        c = compare_tensor(
            ref,
            got,
            atol,
            self.rtol,
            strict=True,
            allow_vacuous=self.allow_vacuous,
            classifier=classifier,
        )
        return c, atol

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"atol": self.atol, "rtol": self.rtol}
        if self.atol_scale is not None:
            out["atol_scale"] = self.atol_scale
        if self.allow_vacuous:
            out["allow_vacuous"] = True
        return out


@dataclass
class Checked:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, Inputs] = field(default_factory=dict)  # label → the inputs of that case


def _by_name(
    actual: Sequence[torch.Tensor] | Mapping[str, torch.Tensor], names: list[str]
) -> dict[str, torch.Tensor]:
    """A backend's answer keyed by output name: named answers as they are, lists by position."""
    if isinstance(actual, Mapping):
        return {n: actual[n] for n in names if n in actual}
    return dict(zip(names, actual, strict=False))


def fixed_axes(exported: ExportedModel, backend: Backend) -> dict[str, int]:
    """The axes `backend`'s artifact was compiled at one size for (--fix-axis), else {}."""
    record = exported.manifest.artifacts.get(backend.format_key or "")
    return dict(record.get("fixed_axes") or {}) if record else {}


def largest_sizes(exported: ExportedModel, backend: Backend) -> dict[str, int]:
    """The largest size of each axis `backend`'s artifact takes (an ExecuTorch program plans
    its buffers for them: `max_sizes`; a .pt2's code branches on them: `bounded_axes`),
    else {}."""
    record = exported.manifest.artifacts.get(backend.format_key or "")
    if not record:
        return {}
    planned, bounded = record.get("max_sizes") or {}, record.get("bounded_axes") or {}
    return {a: min(planned.get(a, n), bounded.get(a, n)) for a, n in {**planned, **bounded}.items()}


def runs_on(exported: ExportedModel, backend: Backend, inputs: Inputs) -> bool:
    """Whether `backend` takes `inputs`: an artifact with fixed axes takes only those sizes,
    one with largest sizes nothing larger."""
    entry = exported.entry
    return entry.fits(inputs, fixed_axes(exported, backend)) and entry.within(
        inputs, largest_sizes(exported, backend)
    )


def _too_large_note(backend: str, why: str, labels: list[str]) -> str:
    return (
        f"{backend}: not sent, over the server's request size limit "
        f"({textwrap.shorten(why, 240, placeholder=' …')}): the "
        f"{len(labels)} input set(s) {', '.join(labels[:4])}{', …' if len(labels) > 4 else ''}; "
        "start the server with a larger --max-request-size to check them"
    )


def _skipped_note(exported: ExportedModel, backend: Backend, labels: list[str]) -> str:
    sizes = ", ".join(
        [f"{a}={n}" for a, n in fixed_axes(exported, backend).items()]
        + [f"{a} ≤ {n}" for a, n in largest_sizes(exported, backend).items()]
    )
    return (
        f"{backend.name} was compiled for {sizes} only (a fixed axis: --fix-axis, a trace that unrolled it; or a largest size: ExecuTorch's plan, a size the code branches on): not run on the "
        f"{len(labels)} input set(s) of other sizes ({', '.join(labels[:4])}"
        f"{', …' if len(labels) > 4 else ''})"
    )


def skipped_notes(
    exported: ExportedModel, backends: Sequence[Backend], cases: Sequence[Case]
) -> list[str]:
    """What check_cases notes of its backends, for the task-level ones (check_task): the
    cases of sizes an artifact was not compiled for (an int8 `.pte`'s planned batch)."""
    notes = []
    for backend in backends:
        labels = [label for label, inputs, _ in cases if not runs_on(exported, backend, inputs)]
        if labels:
            notes.append(_skipped_note(exported, backend, labels))
    return notes


def check_cases(
    exported: ExportedModel, backends: Sequence[Backend], cases: Sequence[Case], tol: Tol
) -> Checked:
    """One row per backend × case × output; the stored golden outputs are a backend too.

    A backend whose artifact has fixed axes runs only the cases of those sizes; the
    others are listed in a note (they would fail by construction, not by a bug)."""
    names = exported.manifest.output_names
    # Top-1 agreement for classifiers (serving shows their top k): the first output.
    classifier = {names[0]} if exported.manifest.serving.topk and names else set()
    detections = detection_fields(exported)
    found: dict[str, detect.Verdict] = {}  # backend → its detection verdicts, summed
    checked = Checked()
    zero_refs: set[str] = set()
    vacuous_accepted: set[str] = set()
    skipped: dict[str, list[str]] = {}
    too_large: dict[str, tuple[str, list[str]]] = {}  # backend → (the refusal, its cases)
    for label, inputs, stored in cases:
        try:
            exported.entry.check_inputs(inputs)
        except InputSpecError as err:  # which of the cases (a --inputs file's, say)
            raise InputSpecError(f"Inputs {label!r}: {err}") from None
        checked.inputs[label] = inputs
        try:
            expected = exported.eager(inputs)
        except Exception as err:  # noqa: BLE001 - the reference itself cannot run these inputs
            raise PipelineError(
                f"Eager {exported.name!r} fails on the {label!r} inputs, so there is no reference "
                f"to compare with: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
            ) from None
        for name, ref in expected.items():
            if ref.is_floating_point() and ref.numel() and not bool(ref.ne(0).any()):
                zero_refs.add(name)
        answers: list[tuple[str, Any]] = []
        if stored is not None:
            answers.append((GOLDEN_FILE_BACKEND, stored))
        for backend in backends:
            if not runs_on(exported, backend, inputs):
                skipped.setdefault(backend.name, []).append(label)
                continue
            try:
                answers.append((backend.name, backend.run(inputs)))
            except TooLargeError as err:  # the server's body limit, not the model's answer
                too_large.setdefault(backend.name, (str(err), []))[1].append(label)
            except Exception as err:  # noqa: BLE001 - a crashing backend is a failed check
                checked.rows += [
                    Row.crashed(backend.name, label, n, err, tol.atol, tol.rtol)
                    for n in ([DETECTIONS] if detections else names)  # judged as one
                ]
        for who, actual in answers:
            got = _by_name(actual, names)
            if detections:  # boxes, scores, labels per image: the detection rule
                checked.rows.append(
                    _detection_row(who, label, expected, got, detections, found, tol.atol)
                )
                continue
            for name, ref in expected.items():
                if name not in got:
                    checked.rows.append(Row.missing(who, label, name, tol.atol, tol.rtol))
                    continue
                c, atol = tol.compare(ref, got[name], name in classifier)
                checked.rows.append(Row.of(who, label, name, c, atol, tol.rtol))
                if tol.allow_vacuous and c.passed and c.vacuous:
                    vacuous_accepted.add(name)
    by_name = {b.name: b for b in backends}
    checked.notes += [_skipped_note(exported, by_name[n], ls) for n, ls in skipped.items()]
    checked.notes += [_too_large_note(n, why, ls) for n, (why, ls) in too_large.items()]
    for name, (why, labels) in too_large.items():  # nothing at all sent: not a pass
        if not any(r.backend == name for r in checked.rows):
            first = DETECTIONS if detections else names[0]
            checked.rows.append(
                Row.crashed(name, labels[0], first, TooLargeError(why), tol.atol, tol.rtol)
            )
    if detections:
        checked.notes.append(DETECTION_RULE)
        checked.notes += [f"{who}: {v.summary()}" for who, v in found.items()]
    for name in sorted(zero_refs):
        checked.notes.append(
            f"eager's {name!r} is all zeros on some inputs: those checks only show that the "
            "backends return zeros too"
        )
    for name in sorted(vacuous_accepted):
        checked.notes.append(
            f"{name!r}: the tolerance cannot tell the reference from zeros, accepted by "
            "--allow-vacuous; these passes prove little"
        )
    return checked


DETECTION_RULE = (
    f"detections are compared per image by the detection rule (docs/verification.md): each "
    f"of eager's detections is matched to the backend's of the same label with IoU ≥ "
    f"{detect.IOU_MATCH}; matched boxes must agree within {detect.BOX_ATOL} px and scores "
    f"within {detect.SCORE_ATOL}, and their other per-detection fields (masks "
    f"{detect.FIELD_ATOL['masks']:g}, keypoints {detect.FIELD_ATOL['keypoints']:g} px, any other "
    f"within --atol); an unmatched detection fails unless its score is within "
    f"{detect.SCORE_ATOL} of another's or of the lowest kept score (a tie); when fewer than "
    f"{detect.MIN_FIRM_SHARE:.0%} of eager's detections are firm, the check is vacuous"
)


def detection_fields(exported: ExportedModel) -> tuple[str, str, str] | None:
    """(boxes, scores, labels) when the export's per-sample outputs are detections."""
    fields = exported.manifest.per_sample
    wanted = ("boxes", "scores", "labels")
    return wanted if set(wanted) <= set(fields) else None


def _detection_row(
    who: str,
    label: str,
    expected: dict[str, torch.Tensor],
    got: dict[str, torch.Tensor],
    fields: tuple[str, str, str],
    found: dict[str, detect.Verdict],
    atol: float,
) -> Row:
    # The other per-sample fields eager answers (masks, keypoints), compared per detection.
    others = tuple(n for n in expected if n not in (*fields, "counts"))
    missing = [n for n in (*fields, *others, "counts") if n not in got]
    if missing:
        c = Comparison.failed(Kind.MISSING, f"the backend did not return {', '.join(missing)}")
        return Row.of(who, label, DETECTIONS, c, detect.BOX_ATOL, 0.0)
    v = detect.compare(expected, got, fields, others, fallback_atol=atol)
    total = found.setdefault(who, detect.Verdict())
    for attr in ("images", "eager", "matched", "firm", "ties", "paste_ties"):
        setattr(total, attr, getattr(total, attr) + getattr(v, attr))
    total.box_err, total.score_err = (
        max(total.box_err, v.box_err),
        max(total.score_err, v.score_err),
    )
    total.min_iou = min(total.min_iou, v.min_iou)
    total.fallback_atol = atol
    for name, err in v.field_err.items():
        total.field_err[name] = max(total.field_err.get(name, 0.0), err)
    if v.vacuous:  # ties everywhere: even a mismatch may be NMS's arbitrary choice
        kind = Kind.VACUOUS
    elif v.problems:
        kind = Kind.TOLERANCE
    else:
        kind = Kind.PASS
    c = Comparison(
        v.box_err,
        v.score_err,
        kind is Kind.PASS,
        "" if kind is Kind.PASS else v.problem(),
        kind,
        vacuous=kind is Kind.VACUOUS,
    )
    return Row.of(who, label, DETECTIONS, c, detect.BOX_ATOL, 0.0)


def reduced(backend: Backend) -> bool:
    """Whether `backend` runs a reduced-precision artifact (judged at task level)."""
    return registry.precision_of(backend.format_key) != registry.FLOAT32


def check_task(
    exported: ExportedModel,
    backends: Sequence[Backend],
    cases: Sequence[Case],
    tol: Tol,
    accuracy_budget: float | None = None,
    min_sqnr: float | None = None,
) -> list[Row]:
    """Task-level rows for the reduced-precision backends (pipeline/verify/task.py): the
    budget export recorded for each artifact, overridden by the given values."""
    names = exported.manifest.output_names
    classifier = bool(exported.manifest.serving.topk)
    validation = None
    if task.rule_for(exported.entry, classifier) == task.ACCURACY:
        # Loaded once for every backend, in batches each of them takes (an ExecuTorch
        # program's planned largest batch may be below VALIDATION_BATCH; an artifact
        # compiled at one batch size takes only that).
        planned = [exported.manifest.artifacts.get(b.format_key or "") or {} for b in backends]
        batch = min([task.VALIDATION_BATCH, *map(task.validation_batch, planned)])
        whole = any(map(task.batch_fixed, planned))
        validation = task.validation_batches(exported.entry, batch, whole)
    rows: list[Row] = []
    for backend in backends:
        inputs = [(label, i) for label, i, _ in cases if runs_on(exported, backend, i)]
        key = backend.format_key
        record = exported.manifest.artifacts.get(key or "")
        recorded = Budget.from_json(record.get("budget") if record else None)
        budget = recorded.override(accuracy_budget, min_sqnr)
        precision = registry.precision_of(key)
        try:
            verdicts = task.judge(
                exported.entry,
                classifier,
                exported.eager,
                backend.run,
                inputs,
                names,
                precision,
                budget,
                validation,
            )
        except Exception as err:  # noqa: BLE001 - a crashing backend is a failed check
            label = "validation split" if validation is not None else "golden+probe+random"
            rows += [Row.crashed(backend.name, label, n, err, tol.atol, tol.rtol) for n in names]
            continue
        rows += [
            Row(backend.name, v.inputs_label, v.output, tol.atol, tol.rtol, v.comparison(), v)
            for v in verdicts
        ]
    return rows
