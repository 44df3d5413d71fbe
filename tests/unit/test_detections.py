"""The detection rule (pipeline/core/detections.py) and the per-sample output structure
(pipeline_runtime/outputs.py) on hand-made detections: each part of the rule passes what
it should, fails what it should, and refuses to judge ties."""

from __future__ import annotations

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
