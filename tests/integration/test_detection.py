"""A torchvision detector through export and verify (issue 36): per-sample outputs in the
manifest, TorchScript scripted and ONNX traced at one image, --random-init's spread
scores, the C++ client, and a detection rule that passes the real thing, fails an altered
head and refuses to judge ties. Served answers are checked beside the other formats' in
test_formats.py (TorchServe) and test_kserve_interop.py (the KServe runtime)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from pipeline.core import detections as detect
from pipeline.export.opened import open_export
from pipeline.formats.per_sample import UNTRACED
from pipeline.verify import VerifyConfig, verify
from pipeline_runtime.outputs import name_outputs
from tests.integration.conftest import DETECTOR, DETECTOR_BATCHES
from tests.tamper import alter_onnx_initializer, copy_export

DATA = Path(__file__).parent / "data"


def _verify(export_dir: Path, tmp_path: Path, **more: Any):
    return verify(
        VerifyConfig(
            model=open_export(export_dir).name,
            export_dir=export_dir,
            report=tmp_path / "parity.json",
            page=False,
            batch_sizes=DETECTOR_BATCHES,
            **more,
        )
    )


def test_the_detector_exports_torchscript_and_onnx_from_the_command_line(
    detector: dict[str, Any],
) -> None:
    assert detector["returncode"] == 0, detector["stderr"][-3000:]
    manifest = open_export(Path(detector["export_dir"])).manifest
    assert manifest.per_sample == ("boxes", "scores", "labels")
    assert [(o.name, o.shape) for o in manifest.outputs] == [
        ("boxes", ("detections", 4)),
        ("scores", ("detections",)),
        ("labels", ("detections",)),
        ("counts", ("batch",)),
    ]
    ts, onnx = manifest.artifact("torchscript"), manifest.artifact("onnx")
    assert ts.get("method") == "script" and ts.reason.startswith(UNTRACED), ts.reason
    assert ts.get("op_libraries") == ["torchvision"]  # NMS: the C++ client loads it first
    assert onnx.get("fixed_axes") == {"batch": 1} and "traced" in onnx.reason
    assert "rescaled" in manifest.model.init_note  # --random-init spread the class scores


def test_verify_passes_in_process_and_in_cpp_with_spread_scores(
    detector: dict[str, Any], binary: Path, tmp_path: Path
) -> None:
    report = _verify(Path(detector["export_dir"]), tmp_path, with_cpp=True, cpp_binary=binary)
    assert report.passed, report.failure_message()
    rows = [r for r in report.rows if r.backend != "golden file"]
    assert {"torchscript", "onnxruntime"} < {r.backend for r in rows}
    assert any(r.backend.startswith("cpp") for r in rows)
    assert {r.output for r in rows} == {"detections"}
    assert all(r.kind == "pass" and not r.comparison.vacuous for r in rows)
    # ONNX runs only where its traced batch allows, and says so.
    assert {r.inputs for r in rows if r.backend == "onnxruntime"} >= {"random b=1"}
    assert any("onnxruntime was compiled for batch=1 only" in n for n in report.notes)
    assert any("detection rule" in n for n in report.notes)
    summary = next(n for n in report.notes if n.startswith("onnxruntime: "))
    assert "0 unmatched tie(s)" in summary or "tie(s) excused" in summary


def test_an_altered_class_head_fails_the_detection_rule(
    detector: dict[str, Any], tmp_path: Path
) -> None:
    class Made:
        out_dir = Path(detector["export_dir"])

    export_dir = copy_export(Made, tmp_path / "export")  # type: ignore[arg-type]
    graph = onnx.load(str(export_dir / "model.onnx"))
    head = next(
        t.name for t in graph.graph.initializer if "classification_head" in t.name and t.dims
    )
    alter_onnx_initializer(export_dir, head, lambda w: w * np.float32(1.5))
    report = _verify(export_dir, tmp_path, backends=("onnxruntime",))
    assert not report.passed
    message = report.failure_message()
    assert "onnxruntime" in message and ("differs" in message or "no match" in message)


def test_a_detector_whose_scores_all_tie_cannot_be_judged(detector: dict[str, Any]) -> None:
    """Random weights without --random-init's spread: every score the same (1/91 over 91
    classes), so which boxes survive is arbitrary: verify's rule says it cannot judge."""
    opened = open_export(Path(detector["export_dir"]))
    torch.manual_seed(0)
    raw = opened.entry.build(**opened.manifest.model.kwargs).eval()
    images = opened.entry.sample_inputs(opened.entry.sizes(batch=1), torch.Generator())
    with torch.no_grad():
        named = name_outputs(raw(*images.values()), opened.manifest.output_names)
    assert named["scores"].unique().numel() <= 2  # all (or all but) the same score
    verdict = detect.compare(named, named, ("boxes", "scores", "labels"))
    assert verdict.vacuous and not verdict.passed and "vacuous" in verdict.problem()


def test_a_two_stage_detector_at_its_defaults_exports_with_its_own_fields(
    two_stage: dict[str, Any], tmp_path: Path
) -> None:
    """Faster R-CNN answers {boxes, labels, scores}: the outputs follow its own order."""
    assert two_stage["returncode"] == 0, two_stage["stderr"][-3000:]
    export_dir = Path(two_stage["export_dir"])
    manifest = open_export(export_dir).manifest
    assert manifest.per_sample == ("boxes", "labels", "scores")
    assert manifest.output_names == ["boxes", "labels", "scores", "counts"]
    assert "firm" in manifest.model.init_note  # the spread chosen by the firm share
    report = _verify(export_dir, tmp_path)
    assert report.passed, report.failure_message()
    assert all(not r.comparison.vacuous for r in report.rows)


def test_the_default_ssdlite_is_judged_with_most_detections_firm(
    detector: dict[str, Any],
) -> None:
    """91 classes, 300 detections per image: the spread tuned on 5 classes left 263 of
    600 firm (vacuous); the searched one leaves more than MIN_FIRM_SHARE firm."""
    opened = open_export(Path(detector["export_dir"]))
    _, stored = opened.golden()
    verdict = detect.compare(stored, stored, ("boxes", "scores", "labels"))
    assert verdict.eager == 600 and not verdict.vacuous, verdict.summary()
    assert verdict.firm >= detect.MIN_FIRM_SHARE * verdict.eager


def test_a_users_own_wrapper_spreads_scripts_and_verifies(tmp_path: Path) -> None:
    """A user's file holding a torchvision detector: --random-init finds it (by type) and
    spreads its scores; its scripted (losses, detections) answer is handled."""
    from pipeline.export import ExportConfig, export
    from pipeline.zoo.user import parse_input

    made = export(
        ExportConfig(
            model=f"{DATA / 'user_detector.py'}:MyDetector",
            inputs=[parse_input("images:float32:batch,3,320,320:0:1")],
            random_init=True,
            checkpoint=tmp_path / "checkpoint.pt",
            out_dir=tmp_path / "export",
            formats=("torchscript",),
        )
    )
    assert "firm" in made.manifest.model.init_note
    # Served, its requests are not stacked (a user's trial: with the manifest's serving
    # empty, both runtimes split stacked answers row by row: wrong detections with a 200).
    assert made.manifest.serving.stack_requests is False
    ts = made.manifest.artifact("torchscript")
    assert "(losses, detections)" in ts.reason, ts.reason
    report = _verify(made.out_dir, tmp_path)
    assert report.passed, report.failure_message()
    assert all(not r.comparison.vacuous for r in report.rows)


def test_torchvisions_own_detector_state_dict_loads_through_weights(tmp_path: Path) -> None:
    """What a user fine-tunes and saves is torchvision's model's state_dict (no `model.`
    prefix): it loads through --weights, and so does the wrapper's own."""
    import torchvision

    from pipeline.export.weights import checkpoint_for, model_from
    from pipeline.zoo.user import external_entry

    kwargs = {"num_classes": 3, "detections_per_img": 10}
    torch.manual_seed(5)
    tuned = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, **kwargs
    ).eval()
    torch.save(tuned.state_dict(), tmp_path / "tuned.pt")
    entry = external_entry(DETECTOR, kwargs=kwargs)
    ckpt = tmp_path / "checkpoint.pt"
    checkpoint = checkpoint_for(entry, ckpt, weights=tmp_path / "tuned.pt", random_init=False,
                                seed=0, golden={}, atol=1e-5, rtol=1e-4)  # fmt: skip
    model = model_from(entry, checkpoint, ckpt).eval()
    for name, value in tuned.state_dict().items():
        assert torch.equal(model.state_dict()[f"model.{name}"], value), name
    torch.save(model.state_dict(), tmp_path / "wrapper.pt")  # the wrapper's own keys
    again = checkpoint_for(entry, tmp_path / "again.pt", weights=tmp_path / "wrapper.pt",
                           random_init=False, seed=0, golden={}, atol=1e-5, rtol=1e-4)  # fmt: skip
    model_from(entry, again, tmp_path / "again.pt")


def test_a_sigmoid_head_detector_gets_its_bias_shifted_until_most_detections_are_firm() -> None:
    """RetinaNet scores each class with a sigmoid from a prior bias of -4.6 and keeps the
    far tail of its logits (91 classes, 300 detections): spreading the weights alone left
    fewer than half firm (264 of 600 at 800x800). Its bias is shifted as well, so the kept
    logits sit where the sigmoid is steep, at a spread whose float32 rounding leaves the
    rule's score tolerance to the backend (recomputed here in float64). Here at 128x128
    inside, to be quick."""
    import copy

    from pipeline.export.random_init import initialise
    from pipeline.zoo.detection import ROUNDING_SHARE
    from pipeline.zoo.user import external_entry

    entry = external_entry(
        "torchvision:retinanet_resnet50_fpn", kwargs={"min_size": 128, "max_size": 128}
    )
    golden = entry.golden_inputs(torch.Generator().manual_seed(0))
    model, done = initialise(entry, 0, golden, atol=1e-5, rtol=1e-4)
    assert "bias shifted" in done.after, done.after
    with torch.no_grad():
        answers = model(*golden.values())
    assert [a["scores"].numel() for a in answers] == [300] * len(answers)
    firm = sum(detect.firm_count(a["scores"]) for a in answers)
    assert firm >= detect.MIN_FIRM_SHARE * 300 * len(answers), done.after
    assert "float32 rounding moves scores by at most" in done.after, done.after

    with torch.no_grad():
        exact = copy.deepcopy(model).double()(*(v.double() for v in golden.values()))
    verdict = detect.Verdict()
    for index, (wide, narrow) in enumerate(zip(exact, answers, strict=True)):
        detect.compare_image(
            *(
                detect.Image(a["boxes"].float(), a["scores"].float(), a["labels"])
                for a in (wide, narrow)
            ),
            index,
            verdict,
        )
    assert not verdict.problems, verdict.problems[:3]
    assert verdict.score_err <= detect.SCORE_ATOL * ROUNDING_SHARE, done.after
