"""The rule verify holds detections to (a detector's boxes, scores and labels per image).

Elementwise comparison does not fit them: which boxes survive non-maximum suppression,
the score threshold and the per-image cap is a *decision*, and two detections whose
scores differ by less than the backends' rounding may swap places. So, per image:

1. **Match** each of eager's detections, highest score first, to the backend's
   unmatched detection of the same label with the highest IoU, if that IoU is at
   least `IOU_MATCH`.
2. **Matched pairs** must agree: box corners within `BOX_ATOL` pixels, scores within
   `SCORE_ATOL`.
3. **Unmatched detections** (on either side) fail, unless they are **ties**: a score
   within `SCORE_ATOL` of another detection's in the same image (NMS or the cap could
   keep either), or of the cut, the lowest score either side kept (the score
   threshold or the per-image cap ended the list there).
   Any other per-detection field (Mask R-CNN's `masks`, Keypoint R-CNN's `keypoints`)
   must agree row for row within its own tolerance (`FIELD_ATOL`).
4. **Ties everywhere prove nothing.** When fewer than `MIN_FIRM_SHARE` of eager's
   detections are firm (not ties), or eager found none, the comparison cannot judge:
   it fails as vacuous instead of passing (random weights tie every score).

docs/verification.md ("Detections") states the rule and why these tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

IOU_MATCH = 0.9  # the same box, computed twice: float rounding moves corners by ~1e-3 px
# Pixels. ONNX Runtime's boxes differed from eager's by up to 1.3e-3 px on SSDlite at 320,
# but by 0.011 on FCOS (ResNet-50, random weights) at 800, where eager's own float32
# boxes were already 0.0103 px from its float64 ones: the tolerance leaves twice eager's
# rounding to the backend, and stays far under any fault one would see (a tenth of a pixel).
BOX_ATOL = 0.04
SCORE_ATOL = 2e-4  # probability; ONNX Runtime's scores differed by up to 1.3e-4 (saturated logits)
MIN_FIRM_SHARE = 0.5
# The other per-detection fields of a matched pair (measured on Mask R-CNN and Keypoint
# R-CNN, random weights, 128x128 inside; docs/verification.md "Detections").
FIELD_ATOL = {
    "masks": 1e-3,  # probability per pixel; ONNX Runtime's differed by up to 4.6e-4
    "keypoints": BOX_ATOL,  # pixels (x, y) and a visibility of 1; ONNX Runtime's: 6.3e-3
    "keypoints_scores": 2e-3,  # heatmap logits (up to ~5); ONNX Runtime's differed by 8.6e-4
}
# torchvision pastes each mask into the image at its box grown by (M + 2) / M and cut to
# whole pixels (roi_heads.paste_masks_in_image; M = 28 in every Mask R-CNN builder). Two
# boxes 0.003 px apart can cut to sizes a pixel apart, and a mask resampled to the other
# size differs across its whole region (by up to 0.18, ONNX Runtime at 2 of 600): such a
# pair's masks are a tie, excused and counted, not compared.
MASK_RESOLUTION = 28


@dataclass
class Image:
    """One image's detections: boxes [n, 4] (x1, y1, x2, y2), scores [n], labels [n]."""

    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    fields: dict[str, torch.Tensor] = field(default_factory=dict)  # other per-detection rows

    @property
    def count(self) -> int:
        return int(self.scores.numel())


@dataclass
class Verdict:
    """What comparing one input set's detections found."""

    images: int = 0
    eager: int = 0  # eager's detections
    matched: int = 0
    firm: int = 0  # eager's detections that are not ties
    ties: int = 0  # unmatched detections excused as ties
    box_err: float = 0.0  # worst |corner difference| of a matched pair, pixels
    score_err: float = 0.0
    min_iou: float = 1.0
    field_err: dict[str, float] = field(default_factory=dict)  # worst per other field
    fallback_atol: float = BOX_ATOL  # for a per-detection field FIELD_ATOL does not name
    paste_ties: int = 0  # matched pairs whose masks were pasted on boxes a pixel apart
    problems: list[str] = field(default_factory=list)

    @property
    def vacuous(self) -> bool:
        return self.eager == 0 or self.firm < MIN_FIRM_SHARE * self.eager

    @property
    def passed(self) -> bool:
        return not self.problems and not self.vacuous

    def summary(self) -> str:
        others = "".join(
            f", {name} within {err:.2g} (≤ {field_atol(name, self.fallback_atol):g})"
            for name, err in self.field_err.items()
        )
        return (
            f"{self.matched} of eager's {self.eager} detections matched over {self.images} "
            f"image(s) (IoU ≥ {IOU_MATCH}, worst {self.min_iou:.4f}); boxes within "
            f"{self.box_err:.2g} px (≤ {BOX_ATOL}), scores within {self.score_err:.2g} "
            f"(≤ {SCORE_ATOL}){others}; {self.ties} unmatched tie(s) excused; {self.firm} firm"
            + (
                f"; {self.paste_ties} mask(s) pasted on boxes cut a pixel apart, not compared"
                if self.paste_ties
                else ""
            )
        )

    def problem(self) -> str:
        if self.problems and not self.vacuous:
            more = f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
            return "; ".join(self.problems[:3]) + more
        if self.eager == 0:
            return (
                "vacuous: eager found no detections on these inputs, so there is nothing to compare"
            )
        return (
            f"vacuous: only {self.firm} of eager's {self.eager} detections are firm; the rest "
            f"have a score within {SCORE_ATOL} of another detection's or of the cut, so which "
            "of them survive is arbitrary and the comparison cannot fail"
            + (
                f" (nor can its {len(self.problems)} mismatch(es) tell a wrong backend from "
                "that arbitrary choice)"
                if self.problems
                else ""
            )
            + ". Give the detector spread scores (trained weights; --random-init rescales "
            "the classification heads of torchvision detectors, and of a model holding one)"
        )


def field_atol(name: str, fallback: float) -> float:
    """The tolerance of a per-detection field; `fallback` (verify's --atol) for a field the
    rule does not know, such as a user's own."""
    return FIELD_ATOL.get(name, fallback)


def paste_box(box: torch.Tensor) -> list[int]:
    """The whole-pixel box torchvision pastes a Mask R-CNN mask into (see MASK_RESOLUTION)."""
    from torchvision.models.detection.roi_heads import expand_boxes

    scale = float(MASK_RESOLUTION + 2) / MASK_RESOLUTION
    return expand_boxes(box.float()[None], scale).to(torch.int64)[0].tolist()


def _field_problems(
    eager: Image, got: Image, i: int, j: int, index: int, verdict: Verdict
) -> list[str]:
    """How matched pair (eager's i, the backend's j) differs in the other fields."""
    problems = []
    for name, rows in eager.fields.items():
        theirs = got.fields.get(name)
        if theirs is None:
            problems.append(f"image {index}: the backend's detections have no {name!r}")
            continue
        a, b = rows[i], theirs[j]
        if name == "masks" and paste_box(eager.boxes[i]) != paste_box(got.boxes[j]):
            verdict.paste_ties += 1
            continue
        if a.shape != b.shape:
            problems.append(
                f"image {index}: eager's detection {i} has {name} of shape {tuple(a.shape)}, "
                f"the backend's {tuple(b.shape)}"
            )
            continue
        err = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        verdict.field_err[name] = max(verdict.field_err.get(name, 0.0), err)
        atol = 0.0 if not a.is_floating_point() else field_atol(name, verdict.fallback_atol)
        if err > atol:
            problems.append(
                f"image {index}: eager's detection {i} (label {int(eager.labels[i])}) is matched "
                f"but its {name} differ by {err:.3g} (≤ {atol:g})"
            )
    return problems


def _near(value: float, others: torch.Tensor) -> bool:
    return bool(((others - value).abs() <= SCORE_ATOL).any()) if others.numel() else False


def _tie(score: float, others: torch.Tensor, cut: float) -> bool:
    """Whether a detection of `score` could have swapped with another, or with the cut."""
    return score - cut <= SCORE_ATOL or _near(score, others)


def _crowded(scores: torch.Tensor) -> torch.Tensor:
    """For each score, whether another of `scores` lies within SCORE_ATOL of it. Sorted,
    a score's nearest others are its neighbours (rounding keeps the order), so one pass
    over neighbour gaps, in the scores' own dtype, answers what comparing each score with
    every other did (300 detections: 90,000 comparisons per image, most of a verify)."""
    order = torch.argsort(scores)
    close = (scores[order][1:] - scores[order][:-1]).abs() <= SCORE_ATOL
    near = torch.zeros(scores.numel(), dtype=torch.bool)
    near[1:] |= close
    near[:-1] |= close
    out = torch.empty_like(near)
    out[order] = near
    return out


def firm_count(scores: torch.Tensor) -> int:
    """How many of one image's detections are firm: no other of its scores within
    SCORE_ATOL, and above its own cut (its lowest score) by more than SCORE_ATOL."""
    if not scores.numel():
        return 0
    cut = float(scores.min())
    above = torch.tensor([float(s) - cut > SCORE_ATOL for s in scores.tolist()])
    return int((above & ~_crowded(scores)).sum())


def _match(eager: Image, got: Image) -> list[tuple[int, int | None, float]]:
    """Step 1 of the rule: (eager's i, the backend's j or None, their IoU), eager's
    highest score first; of equal IoUs the backend's later detection is taken."""
    from torchvision.ops import box_iou

    if not (eager.count and got.count):
        return [(i, None, 0.0) for i in range(eager.count)]
    iou = box_iou(eager.boxes.double(), got.boxes.double()).numpy()
    same = eager.labels.numpy()[:, None] == got.labels.numpy()[None, :]
    free = np.ones(got.count, dtype=bool)
    out: list[tuple[int, int | None, float]] = []
    for i in torch.argsort(eager.scores, descending=True).tolist():
        row = np.where(free & same[i] & (iou[i] >= IOU_MATCH), iou[i], -1.0)
        best = got.count - 1 - int(np.argmax(row[::-1]))  # the last of the highest
        if row[best] < 0:
            out.append((i, None, 0.0))
            continue
        free[best] = False
        out.append((i, best, float(iou[i, best])))
    return out


def compare_image(eager: Image, got: Image, index: int, verdict: Verdict) -> None:
    """Add image `index`'s comparison to `verdict` (see the module docstring)."""
    verdict.images += 1
    verdict.eager += eager.count
    cut = float(torch.cat([eager.scores, got.scores]).min()) if eager.count + got.count else 0.0
    every = torch.cat([eager.scores, got.scores])
    verdict.firm += firm_count(eager.scores)
    boxes = (eager.boxes.double().numpy(), got.boxes.double().numpy())
    scores = (eager.scores.tolist(), got.scores.tolist())
    taken: set[int] = set()
    unmatched_eager = []
    for i, best, best_iou in _match(eager, got):
        if best is None:
            unmatched_eager.append(i)
            continue
        taken.add(best)
        verdict.matched += 1
        verdict.min_iou = min(verdict.min_iou, best_iou)
        box_err = float(np.abs(boxes[0][i] - boxes[1][best]).max())
        score_err = abs(scores[0][i] - scores[1][best])
        verdict.box_err = max(verdict.box_err, box_err)
        verdict.score_err = max(verdict.score_err, score_err)
        if box_err > BOX_ATOL or score_err > SCORE_ATOL:
            verdict.problems.append(
                f"image {index}: eager's detection {i} (label {int(eager.labels[i])}, score "
                f"{scores[0][i]:.4f}) is matched but differs: box by {box_err:.3g} px "
                f"(≤ {BOX_ATOL}), score by {score_err:.3g} (≤ {SCORE_ATOL})"
            )
        if eager.fields:
            verdict.problems += _field_problems(eager, got, i, best, index, verdict)
    for side, image, rows in (
        ("eager's", eager, unmatched_eager),
        ("the backend's", got, [j for j in range(got.count) if j not in taken]),
    ):
        for r in rows:
            score = float(image.scores[r])
            offset = 0 if image is eager else eager.count
            others = torch.cat([every[: offset + r], every[offset + r + 1 :]])
            if _tie(score, others, cut):
                verdict.ties += 1
                continue
            verdict.problems.append(
                f"image {index}: {side} detection {r} (label {int(image.labels[r])}, score "
                f"{score:.4f}, box {[round(float(v), 1) for v in image.boxes[r]]}) has no match "
                f"and no tie (no score within {SCORE_ATOL} of it or of the cut {cut:.4f})"
            )


def split(
    named: dict[str, torch.Tensor], fields: tuple[str, str, str], others: tuple[str, ...] = ()
) -> list[Image]:
    """Collated detections (boxes, scores, labels, `others`, counts) → one Image per input
    image; an absent other field is left out (the rule reports it)."""
    boxes, scores, labels = (named[f] for f in fields)
    out, start = [], 0
    for n in named["counts"].flatten().tolist():
        end = start + int(n)
        rows = {f: named[f][start:end] for f in others if f in named}
        out.append(Image(boxes[start:end], scores[start:end], labels[start:end], rows))
        start = end
    return out


def compare(
    eager: dict[str, torch.Tensor],
    got: dict[str, torch.Tensor],
    fields: tuple[str, str, str],
    others: tuple[str, ...] = (),
    fallback_atol: float = BOX_ATOL,
) -> Verdict:
    """Eager's and a backend's collated detections on one input set, under the rule;
    `others` are the further per-detection fields (masks, keypoints), `fallback_atol` the
    tolerance of one FIELD_ATOL does not name."""
    verdict = Verdict(fallback_atol=fallback_atol)
    mine, theirs = split(eager, fields, others), split(got, fields, others)
    if len(mine) != len(theirs):
        verdict.problems.append(f"{len(theirs)} images answered, eager answered {len(mine)}")
        return verdict
    for index, (e, g) in enumerate(zip(mine, theirs, strict=True)):
        compare_image(e, g, index, verdict)
    return verdict
