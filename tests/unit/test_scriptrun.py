"""A TorchScript module that compiles and then fails when run is an ExportError that says
what to write (pipeline/formats/scriptrun.py). A user's wrapper indexing its torchvision
detector's answer as eager does (`out[0]["boxes"]`) scripted, then raised KeyError on the
probes: export printed a raw traceback instead of the advice export.md promises."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.formats.scriptrun import against_eager


class Indexes(nn.Module):
    """Scripts; fails when run, as the scripted detector's (losses, detections) did."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fields = {"scores": x}
        return fields["boxes"]


class HoldsADetector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.det = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=3
        )


PROBES = [("random", {"x": torch.ones(2)})]


def test_a_module_that_fails_when_run_gets_advice_not_a_traceback() -> None:
    scripted = torch.jit.script(Indexes())
    with pytest.raises(ExportError, match="fails on probe 'random'") as err:
        against_eager(Indexes(), scripted, PROBES, 1e-5, 1e-4, "GENERIC")
    assert str(err.value).endswith("GENERIC")
    with pytest.raises(ExportError) as err:
        against_eager(HoldsADetector(), scripted, PROBES, 1e-5, 1e-4, "GENERIC")
    assert "torch.jit.is_scripting()" in str(err.value) and "det: SSD" in str(err.value)


def test_a_module_that_runs_is_compared_as_before() -> None:
    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    scripted = torch.jit.script(Double())
    assert against_eager(Double(), scripted, PROBES, 1e-5, 1e-4, "") is None
