"""The detection rule (pipeline/core/detections.py) and the per-sample output structure
(pipeline_runtime/outputs.py) on hand-made detections: each part of the rule passes what
it should, fails what it should, and refuses to judge ties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core import detections as detect
from pipeline_runtime.manifest import Manifest, ManifestError
from pipeline_runtime.outputs import collate, name_outputs, per_sample_fields, split_samples

FIELDS = ("boxes", "scores", "labels")


def _image(scores: list[float], labels: list[int] | None = None, shift: float = 0.0) -> dict:
    n = len(scores)
    boxes = torch.tensor([[10.0 * i, 5.0, 10.0 * i + 8, 20.0] for i in range(n)]) + shift
    return {
        "boxes": boxes.reshape(n, 4),
        "scores": torch.tensor(scores),
        "labels": torch.tensor(labels or [1] * n, dtype=torch.int64),
    }


def _named(images: list[dict]) -> dict[str, torch.Tensor]:
    return name_outputs(images, [*FIELDS, "counts"])


SPREAD = [0.9, 0.8, 0.7, 0.6, 0.5]


def test_per_sample_outputs_collate_batch_major_with_counts_and_split_back() -> None:
    images = [_image(SPREAD[:2]), _image([]), _image(SPREAD[:3])]
    assert per_sample_fields(images, 3) == FIELDS
    assert per_sample_fields(images, 2) is None  # not one dict per sample of the batch
    assert per_sample_fields((images[0], images[1]), 2) is None  # a tuple is not a batch list
    named = _named(images)
    assert named["boxes"].shape == (5, 4) and named["counts"].tolist() == [2, 0, 3]
    back = split_samples(named, FIELDS)
    assert [len(b["scores"]) for b in back] == [2, 0, 3]
    assert torch.equal(back[2]["boxes"], images[2]["boxes"])
    flat = collate(images, FIELDS)
    assert [t.shape[0] for t in flat] == [5, 5, 5, 3]
    # A request without its batch axis: counts is a scalar (asked.unbatch); it failed with
    # "iteration over a 0-d array" (a user's trial).
    one = _named([images[2]])
    (alone,) = split_samples({**one, "counts": np.asarray(3)}, FIELDS)
    assert torch.equal(alone["boxes"], images[2]["boxes"])


def test_the_same_detections_pass_with_every_one_firm() -> None:
    eager = _named([_image(SPREAD), _image(SPREAD[:3])])
    v = detect.compare(eager, eager, FIELDS)
    assert v.passed and (v.images, v.eager, v.matched) == (2, 8, 8)
    assert v.firm == 6  # each image's lowest detection sits at its own cut


def test_a_box_moved_past_the_tolerance_fails_naming_the_image() -> None:
    eager = _named([_image(SPREAD)])
    moved = _named([_image(SPREAD, shift=0.05)])  # IoU still ≥ 0.9: matched, but off
    v = detect.compare(eager, moved, FIELDS)
    assert not v.passed and "image 0" in v.problem() and "box by 0.05 px" in v.problem()
    assert detect.compare(eager, _named([_image(SPREAD, shift=0.001)]), FIELDS).passed


def test_a_score_off_by_more_than_the_tolerance_fails() -> None:
    eager = _named([_image(SPREAD)])
    off = _named([_image([0.9, 0.8, 0.7 + 5 * detect.SCORE_ATOL, 0.6, 0.5])])
    v = detect.compare(eager, off, FIELDS)
    assert not v.passed and "score by" in v.problem()


def test_a_firm_detection_the_backend_lost_fails() -> None:
    eager = _named([_image(SPREAD)])
    lost = _named([_image(SPREAD[:2] + SPREAD[3:])])  # 0.7 gone, far from any other
    lost["boxes"][2:] = eager["boxes"][3:]  # the others keep their boxes
    v = detect.compare(eager, lost, FIELDS)
    assert not v.passed and "no match and no tie" in v.problem() and "score 0.7000" in v.problem()


def test_a_swap_between_tied_scores_is_excused() -> None:
    tied = [0.95, 0.9, 0.85, 0.8, 0.7, 0.7 + detect.SCORE_ATOL / 2, 0.5]
    eager = _named([_image(tied, labels=[1, 1, 1, 1, 1, 2, 1])])
    # The backend kept the other of two tied class scores for the sixth box.
    swapped = _named([_image(tied, labels=[1, 1, 1, 1, 1, 3, 1])])
    v = detect.compare(eager, swapped, FIELDS)
    assert v.passed, v.problem()
    assert v.ties == 2 and v.matched == 6  # the unmatched pair, one on each side
    apart = _named([_image([*tied[:5], 0.6, 0.5], labels=[1, 1, 1, 1, 1, 3, 1])])
    assert not detect.compare(eager, apart, FIELDS).passed  # no tie: the swap is a failure


def test_scores_that_all_tie_cannot_be_judged() -> None:
    flat = [0.2] * 5  # random weights: every score the same
    eager = _named([_image(flat)])
    v = detect.compare(eager, eager, FIELDS)
    assert v.vacuous and not v.passed and "vacuous" in v.problem()
    assert "0 of eager's 5 detections are firm" in v.problem()
    empty = _named([_image([])])
    assert detect.compare(empty, empty, FIELDS).vacuous  # nothing found: nothing proven


def _with_masks(scores: list[float], offset: float = 0.0, at: int = 0) -> dict:
    """An image whose detections carry Mask R-CNN's `masks` [n, 1, 8, 8]; detection `at`'s
    mask moved by `offset`."""
    image = _image(scores)
    masks = torch.linspace(0, 1, len(scores) * 64).reshape(len(scores), 1, 8, 8)
    masks[at, 0, 3, 3] += offset
    return {**image, "masks": masks}


def test_other_per_detection_fields_are_held_to_their_own_tolerance() -> None:
    """Mask R-CNN's masks (Keypoint R-CNN's keypoints alike) are compared row for row on
    matched pairs: without it a wrong mask head would pass on its boxes alone."""
    names = [*FIELDS, "masks", "counts"]
    eager = name_outputs([_with_masks(SPREAD)], names)
    atol = detect.FIELD_ATOL["masks"]
    near = name_outputs([_with_masks(SPREAD, offset=atol / 2, at=2)], names)
    v = detect.compare(eager, near, FIELDS, ("masks",))
    assert v.passed and v.field_err["masks"] == pytest.approx(atol / 2, rel=1e-3)
    assert "masks within" in v.summary()
    off = name_outputs([_with_masks(SPREAD, offset=3 * atol, at=2)], names)
    v = detect.compare(eager, off, FIELDS, ("masks",))
    assert not v.passed
    assert "eager's detection 2 (label 1) is matched but its masks differ by 0.003" in v.problem()
    # Boxes, scores and labels alone could not have told.
    assert detect.compare(eager, off, FIELDS).passed


def test_masks_pasted_on_boxes_cut_a_pixel_apart_are_a_tie_and_only_those() -> None:
    """torchvision pastes a mask at its grown box cut to whole pixels: these two boxes,
    0.003 px apart (eager's and ONNX Runtime's, measured on Mask R-CNN), cut to 137 and
    138, and the resampled masks differed by 0.18 over 4,214 pixels."""
    names = [*FIELDS, "masks", "counts"]
    eager_box, ort_box = [19.852, 272.041, 133.923, 306.649], [19.854, 272.04, 133.926, 306.648]
    assert detect.paste_box(torch.tensor(eager_box)) != detect.paste_box(torch.tensor(ort_box))
    masks = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))

    def one(box: list[float], offset: float) -> dict[str, torch.Tensor]:
        """`box` and a second detection that both sides agree on (the cut, 0.5)."""
        return name_outputs(
            [
                {
                    "boxes": torch.tensor([box, [200.0, 10.0, 220.0, 30.0]]),
                    "scores": torch.tensor([0.9, 0.5]),
                    "labels": torch.tensor([1, 1]),
                    "masks": masks + torch.tensor([offset, 0.0]).reshape(2, 1, 1, 1),
                }
            ],
            names,
        )

    v = detect.compare(one(eager_box, 0.0), one(ort_box, 0.18), FIELDS, ("masks",))
    assert v.passed and v.paste_ties == 1 and "pasted on boxes cut a pixel apart" in v.summary()
    # The same cut: compared, and 0.18 fails.
    same = [c + 0.001 for c in eager_box]
    assert detect.paste_box(torch.tensor(same)) == detect.paste_box(torch.tensor(eager_box))
    v = detect.compare(one(eager_box, 0.0), one(same, 0.18), FIELDS, ("masks",))
    assert not v.passed and v.paste_ties == 0 and "masks differ by 0.18" in v.problem()


def test_a_field_the_rule_does_not_know_uses_verifys_atol_and_a_missing_one_fails() -> None:
    names = [*FIELDS, "embedding", "counts"]

    def image(offset: float) -> dict:
        return {**_image(SPREAD), "embedding": torch.ones(len(SPREAD), 3) + offset}

    eager = name_outputs([image(0.0)], names)
    moved = name_outputs([image(0.05)], names)
    assert detect.compare(eager, moved, FIELDS, ("embedding",), fallback_atol=0.1).passed
    v = detect.compare(eager, moved, FIELDS, ("embedding",), fallback_atol=0.01)
    assert not v.passed and "embedding differ by 0.05 (≤ 0.01)" in v.problem()
    bare = name_outputs([_image(SPREAD)], [*FIELDS, "counts"])
    v = detect.compare(eager, bare, FIELDS, ("embedding",))
    assert not v.passed and "have no 'embedding'" in v.problem()


def test_the_manifest_keeps_the_structure_and_refuses_a_mismatch() -> None:
    data = {
        "format": "pipeline.manifest/2",
        "model": {"name": "torchvision:ssdlite320_mobilenet_v3_large", "kwargs": {}},
        "checkpoint": {"path": "c.pt", "sha256": "0" * 64},
        "inputs": [{"name": "images", "shape": ["batch", 3, 320, 320], "dtype": "float32"}],
        "outputs": [
            {"name": n, "shape": s, "dtype": d}
            for n, s, d in (
                ("boxes", ["detections", 4], "float32"),
                ("scores", ["detections"], "float32"),
                ("labels", ["detections"], "int64"),
                ("counts", ["batch"], "int64"),
            )
        ],
        "tolerance": {"atol": 1e-5, "rtol": 1e-4},
        "artifacts": {},
        "per_sample": {"fields": list(FIELDS), "counts": "counts"},
    }
    manifest = Manifest.from_json(data)
    assert manifest.per_sample == FIELDS
    assert Manifest.from_json(manifest.to_json()).per_sample == FIELDS
    with pytest.raises(ManifestError, match="per-sample fields"):
        Manifest.from_json({**data, "per_sample": {"fields": ["boxes", "scores"]}})


def _reference_firm(scores: torch.Tensor) -> int:
    """The rule's firm count written out one detection at a time (before it was vectorised)."""
    cut = float(scores.min()) if scores.numel() else 0.0
    firm = 0
    for i in range(scores.numel()):
        others = torch.cat([scores[:i], scores[i + 1 :]])
        near = bool(((others - float(scores[i])).abs() <= detect.SCORE_ATOL).any())
        firm += not (float(scores[i]) - cut <= detect.SCORE_ATOL or near)
    return firm


def _reference_match(eager: detect.Image, got: detect.Image) -> list[tuple[int, int | None]]:
    from torchvision.ops import box_iou

    iou = box_iou(eager.boxes.double(), got.boxes.double()) if eager.count and got.count else None
    taken: set[int] = set()
    out: list[tuple[int, int | None]] = []
    for i in torch.argsort(eager.scores, descending=True).tolist():
        best, best_iou = None, detect.IOU_MATCH
        for j in range(got.count):
            if j in taken or int(got.labels[j]) != int(eager.labels[i]) or iou is None:
                continue
            if float(iou[i, j]) >= best_iou:
                best, best_iou = j, float(iou[i, j])
        if best is not None:
            taken.add(best)
        out.append((i, best))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_vectorised_rule_counts_and_matches_as_one_detection_at_a_time_did(seed: int) -> None:
    """Scores on a grid a tolerance wide (ties, exact duplicates), few labels, boxes copied
    and nudged (equal IoUs, near misses): the firm count and every match are the same."""
    g = torch.Generator().manual_seed(seed)
    n, m = (int(v) for v in torch.randint(0, 60, (2,), generator=g))
    grid = detect.SCORE_ATOL * torch.randint(0, 40, (n,), generator=g).float()
    eager = detect.Image(
        torch.rand(n, 2, generator=g).repeat(1, 2) * 50 + torch.tensor([0.0, 0.0, 9.0, 9.0]),
        0.5 + grid,
        torch.randint(1, 4, (n,), generator=g),
    )
    pick = torch.randint(0, max(n, 1), (m,), generator=g) if n else torch.zeros(0, dtype=torch.long)
    nudge = torch.randint(0, 3, (len(pick), 1), generator=g).float() * 0.3
    got = detect.Image(
        eager.boxes[pick] + nudge if n else torch.zeros(0, 4),
        eager.scores[pick] if n else torch.zeros(0),
        eager.labels[pick] if n else torch.zeros(0, dtype=torch.long),
    )
    assert detect.firm_count(eager.scores) == _reference_firm(eager.scores)
    assert [(i, j) for i, j, _ in detect._match(eager, got)] == _reference_match(eager, got)


def test_a_scripted_detectors_tuple_warning_is_kept_out_and_other_warnings_are_not() -> None:
    """Every detector export printed torchvision's "SSD always returns a (Losses,
    Detections) tuple in scripting" (a user's trial, 2026-11-28), which the project
    handles; any module that loads or exports a model imports pipeline_runtime.outputs."""
    import subprocess
    import sys

    code = (
        "import warnings, pipeline_runtime.outputs\n"
        "warnings.warn('SSD always returns a (Losses, Detections) tuple in scripting')\n"
        "warnings.warn('a warning of the model itself')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "a warning of the model itself" in proc.stderr, proc.stderr
    assert "Losses, Detections" not in proc.stderr, proc.stderr
