"""`--random-init` gives outputs of a realistic scale, or says why it cannot.

A freshly built torchvision mobilenet_v3_small answers with logits of about
2e-9: its BatchNorm layers keep mean 0 / variance 1 while the randomly
initialised activations shrink layer by layer. Export calibrates those
statistics on seeded random batches; the same seed still gives the same bytes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from pipeline.core.checkpoint import load_checkpoint
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.export.random_init import (
    CALIBRATION_BATCHES,
    TINY_OUTPUT,
    calibrate,
    norm_layers,
)
from pipeline.zoo import resolve_entry
from pipeline.zoo.user import parse_input

DATA = Path(__file__).parent / "data" / "partial_ops.py"
MOBILENET = "torchvision:mobilenet_v3_small"


def _export(tmp_path: Path, model: str, seed: int = 0, **kw: object) -> ExportResult:
    return export(
        ExportConfig(
            model=model,
            random_init=True,
            seed=seed,
            checkpoint=tmp_path / "checkpoint.pt",
            out_dir=tmp_path / "export",
            formats=("torchscript",),
            **kw,
        )
    )


def _golden_max(result: ExportResult) -> float:
    golden = torch.load(result.out_dir / "golden.pt", weights_only=True)
    return max(float(t.abs().max()) for t in golden["outputs"].values())


def test_mobilenet_logits_reach_a_realistic_scale_deterministically(tmp_path: Path) -> None:
    first = _export(tmp_path / "a", MOBILENET)
    # torchvision initialises the classifier's two Linear layers with N(0, 0.01)
    # and average-pools spatially uncorrelated features: about 0.02 is the scale
    # this init gives on random images once the statistics fit (2e-9 before).
    assert _golden_max(first) > 1e-2
    meta = load_checkpoint(tmp_path / "a" / "checkpoint.pt").meta
    calibration = meta["calibration"]
    assert calibration["norm_layers"] == 34 and calibration["batches"] == CALIBRATION_BATCHES
    assert calibration["output_max_abs"] == pytest.approx(_golden_max(first), rel=1e-5)
    note = first.manifest.model.init_note
    assert first.manifest.model.init == "random"
    assert f"calibrated on {CALIBRATION_BATCHES} random batches" in note
    assert "max |output| on the golden inputs 0.0" in note

    again = _export(tmp_path / "b", MOBILENET)
    other = _export(tmp_path / "c", MOBILENET, seed=1)
    assert again.manifest.checkpoint.sha256 == first.manifest.checkpoint.sha256
    assert (tmp_path / "b" / "checkpoint.pt").read_bytes() == (
        tmp_path / "a" / "checkpoint.pt"
    ).read_bytes()
    assert other.manifest.checkpoint.sha256 != first.manifest.checkpoint.sha256


def test_calibration_resets_the_statistics_and_restores_the_settings() -> None:
    entry = resolve_entry(MOBILENET)
    torch.manual_seed(0)
    model = entry.build()
    layers = norm_layers(model)
    momenta = [m.momentum for m in layers]
    done = calibrate(model, entry, torch.Generator().manual_seed(0))
    assert done.layers == len(layers) == 34 and not done.problem
    assert not model.training and not any(m.training for m in model.modules())
    assert [m.momentum for m in layers] == momenta  # 0.01 in torchvision's mobilenet
    assert all(int(m.num_batches_tracked) == CALIBRATION_BATCHES for m in layers)
    assert not any(torch.equal(m.running_var, torch.ones_like(m.running_var)) for m in layers)


def test_a_model_with_nothing_to_calibrate_and_tiny_outputs_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pipeline.export.random_init"):
        result = _export(tmp_path, f"{DATA}:DeepTanh", inputs=[parse_input("x:float32:batch,16")])
    assert _golden_max(result) < TINY_OUTPUT
    [warning] = [r.getMessage() for r in caplog.records]
    assert "reaches only max |output|" in warning
    assert "no normalisation layers with running statistics to calibrate" in warning
    assert "verify refuses tolerances that cannot tell them from zeros" in warning
    assert "--weights FILE" in warning
    meta = json.loads((tmp_path / "checkpoint.json").read_text())
    assert meta["calibration"]["norm_layers"] == 0
    assert meta["calibration"]["output_max_abs"] < TINY_OUTPUT
    assert result.manifest.model.init_note.startswith("no normalisation layers")


def test_a_model_with_nothing_to_calibrate_but_a_fine_scale_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pipeline.export.random_init"):
        result = _export(tmp_path, f"{DATA}:EigenNet", inputs=[parse_input("x:float32:batch,9")])
    assert not caplog.records
    assert _golden_max(result) > 0.1
    assert result.manifest.model.init_note.startswith("no normalisation layers")


def test_statistics_that_cannot_be_calibrated_are_left_as_built(tmp_path: Path) -> None:
    """A batch of one per channel cannot give train-mode statistics: kept, and said why."""
    result = _export(tmp_path, f"{DATA}:NormOfOne", inputs=[parse_input("x:float32:1,4")])
    meta = json.loads((tmp_path / "checkpoint.json").read_text())
    assert "Expected more than 1 value per channel" in meta["calibration"]["problem"]
    assert meta["calibration"]["batches"] == 0
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.equal(state["norm.running_var"], torch.ones(4))
    assert torch.equal(state["norm.running_mean"], torch.zeros(4))
    assert "NOT calibrated" in result.manifest.model.init_note
