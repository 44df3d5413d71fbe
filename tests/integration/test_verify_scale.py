"""Verify cannot be fooled (issue 16): outputs of tiny scale, a backend returning zeros,
altered weights behind an updated manifest; and when it fails it says where.

Real torchvision models, real ONNX Runtime; the artifacts are altered on disk
with their manifest hashes updated, so only the numbers can catch them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torchvision
from onnx import helper, numpy_helper

from pipeline.core.errors import PipelineError, ToleranceError, VacuousToleranceError
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.verify import VerifyConfig, verify
from tests.tamper import alter_onnx_initializer, copy_export, reseal

MODEL = "torchvision:mobilenet_v3_small"


def _zero_onnx_output(export_dir: Path) -> None:
    """Make the ONNX graph return zeros of the right shape: logits * 0."""
    path = export_dir / "model.onnx"
    model = onnx.load(str(path))
    out = model.graph.output[0].name
    producer = next(n for n in model.graph.node if out in n.output)
    producer.output[list(producer.output).index(out)] = "pre_zero"
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "zero"))
    model.graph.node.append(helper.make_node("Mul", ["pre_zero", "zero"], [out]))
    onnx.save(model, str(path))
    reseal(export_dir, "onnx")


@pytest.fixture(scope="module")
def tiny_scale(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """mobilenet_v3_small with torchvision's own initialisation imported as --weights:
    BatchNorm statistics at mean 0 / var 1, logits of about 1e-9."""
    root = tmp_path_factory.mktemp("mnv3_tiny")
    torch.manual_seed(0)
    weights = root / "init.pt"
    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), weights)
    return export(
        ExportConfig(
            model=MODEL,
            weights=weights,
            checkpoint=root / "checkpoint.pt",
            out_dir=root / "export",
            formats=("onnx",),
        )
    )


def test_outputs_of_tiny_scale_fail_as_vacuous_not_pass(
    tiny_scale: ExportResult, tmp_path: Path
) -> None:
    report = verify(
        VerifyConfig(model=MODEL, export_dir=tiny_scale.out_dir, report=tmp_path / "p.json")
    )
    assert not report.passed
    assert {str(r.kind) for r in report.failures} == {"vacuous"}
    assert max(r.comparison.ref_max for r in report.rows) < 1e-6
    with pytest.raises(VacuousToleranceError, match="all zeros would pass"):
        report.raise_for_failures()
    # Accepted explicitly, it passes with a note; a scale-relative atol really checks.
    accepted = verify(
        VerifyConfig(
            model=MODEL,
            export_dir=tiny_scale.out_dir,
            allow_vacuous=True,
            report=tmp_path / "a.json",
        )
    )
    assert accepted.passed and any("--allow-vacuous" in n for n in accepted.notes)
    scaled = verify(
        VerifyConfig(
            model=MODEL, export_dir=tiny_scale.out_dir, atol_scale=1e-3, report=tmp_path / "s.json"
        )
    )
    assert scaled.passed, scaled.failure_message()
    assert all(r.atol < 1e-10 for r in scaled.rows)
    # Both given: the rows used the scale while the footer printed --atol too.
    with pytest.raises(PipelineError, match="Give --atol or --atol-scale, not both"):
        VerifyConfig(
            model=MODEL, export_dir=tiny_scale.out_dir, atol=1e-3, atol_scale=1e-4
        ).validate()


def test_a_backend_returning_zeros_fails_at_any_scale(
    tiny_scale: ExportResult, mobilenet: ExportResult, tmp_path: Path
) -> None:
    for name, exported in (("tiny", tiny_scale), ("realistic", mobilenet)):
        export_dir = copy_export(exported, tmp_path / name / "export")
        _zero_onnx_output(export_dir)
        report = verify(
            VerifyConfig(
                model=MODEL,
                export_dir=export_dir,
                allow_vacuous=False,
                report=tmp_path / name / "p.json",
            )
        )
        onnx_rows = [r for r in report.rows if r.backend == "onnxruntime"]
        assert onnx_rows and all(not r.passed for r in onnx_rows), name
        if name == "realistic":
            assert {str(r.kind) for r in onnx_rows} == {"tolerance"}
            assert all(r.comparison.top1 is not None for r in onnx_rows)
            with pytest.raises(ToleranceError):
                report.raise_for_failures()


def test_random_init_outputs_have_realistic_scale_and_pass(
    mobilenet: ExportResult, tmp_path: Path
) -> None:
    report = verify(
        VerifyConfig(model=MODEL, export_dir=mobilenet.out_dir, report=tmp_path / "p.json")
    )
    assert report.passed, report.failure_message()
    # Realistic, not tiny: calibrated BatchNorm gives logits of about 0.02 (the classifier's
    # N(0, 0.01) Linear layers set that ceiling), against 2e-9 without calibration.
    assert min(r.comparison.ref_max for r in report.rows) > 1e-2
    assert all(r.comparison.top1 == 1.0 for r in report.rows)
    page = (tmp_path / "p.md").read_text()
    assert "| onnxruntime | logits |" in page
    assert (tmp_path / "p_files" / "hist-onnxruntime-logits.png").stat().st_size > 1000


def test_altered_onnx_weights_fail_and_the_report_names_the_layer(
    mobilenet: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(mobilenet, tmp_path / "export")
    # A convolution weight in the middle of the network (features.6: an inverted residual).
    names = [i.name for i in onnx.load(str(export_dir / "model.onnx")).graph.initializer]
    target = next(n for n in names if "features.6" in n and n.endswith("weight"))
    alter_onnx_initializer(export_dir, target, lambda w: w * np.float32(1.5))

    report = verify(
        VerifyConfig(model=MODEL, export_dir=export_dir, bisect=True, report=tmp_path / "p.json")
    )
    assert not report.passed
    assert {r.backend for r in report.failures} == {"onnxruntime"}
    (loc,) = report.localisations
    assert loc["backend"] == "onnxruntime" and loc["available"]
    assert "features.6" in loc["line"], loc
    assert "features.6" in report.failure_message()
    assert loc["subgraph"] and Path(loc["subgraph"]).is_file()
    page = (tmp_path / "p.md").read_text()
    assert "## Where it diverges" in page and "features.6" in page
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["localisation"][0]["backend"] == "onnxruntime"
    assert saved["failure_kinds"] == ["tolerance"]
