"""The trace/script choice on a tiny gate, the hazard the export stage exists for."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.formats.torchscript import to_torchscript
from pipeline.zoo.rnn import MyDecisionGate


class SignGate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent branch: a trace keeps only one side
            return x
        return -x


POS = torch.ones(2, 3)
NEG = -torch.ones(2, 3)
PROBES = [("positive", {"x": POS}), ("negative", {"x": NEG})]


def test_plain_trace_is_silently_wrong_on_the_other_branch() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(SignGate(), (POS,))
    assert torch.equal(SignGate()(NEG), POS)  # eager: -x of a negative input
    assert torch.equal(traced(NEG), NEG)  # trace: returns x, the wrong sign


def test_auto_rejects_the_trace_names_the_line_and_scripts() -> None:
    result = to_torchscript(SignGate(), {"x": POS}, PROBES, method="auto")
    assert result.method == "script"
    assert "TracerWarning at" in result.reason and "test_torchscript.py" in result.reason
    assert "if x.sum() > 0" in result.reason
    assert torch.equal(result.module(NEG), POS) and torch.equal(result.module(POS), POS)


def test_method_trace_refuses_unless_allowed() -> None:
    with pytest.raises(ExportError, match=r"--method trace refused: .*test_torchscript\.py:\d+"):
        to_torchscript(SignGate(), {"x": POS}, PROBES, method="trace")
    unsafe = to_torchscript(SignGate(), {"x": POS}, PROBES, method="trace", allow_unsafe_trace=True)
    assert unsafe.method == "trace" and "UNSAFE" in unsafe.reason


def test_control_flow_free_model_is_traced() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU()).eval()
    result = to_torchscript(model, {"x": POS}, PROBES, method="auto")
    assert result.method == "trace"
    assert torch.allclose(result.module(NEG), model(NEG))


class VarargsCell(nn.Module):
    """Not scriptable (varargs forward), and untraceable because of its gate."""

    def __init__(self) -> None:
        super().__init__()
        self.dg = MyDecisionGate()
        self.linear = nn.Linear(4, 4)

    def forward(self, *xh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, h = xh
        new_h = torch.tanh(self.dg(self.linear(x)) + h)
        return new_h, new_h


class Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = VarargsCell()

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(xs.size(1), 4)
        y = h
        for i in range(xs.size(0)):
            y, h = self.cell(xs[i], h)
        return y, h


def test_hybrid_scripts_the_gate_traces_the_cell_scripts_the_loop() -> None:
    """The tutorial's composition, found automatically when whole-model scripting fails."""
    torch.manual_seed(0)
    model = Loop().eval()
    probes = [
        (f"p{i}", {"xs": sign * (torch.rand(steps, 2, 4) + 0.5) * 5})
        for i, (sign, steps) in enumerate([(1, 3), (-1, 7), (1, 1), (-1, 2)])
    ]
    result = to_torchscript(model, {"xs": torch.randn(5, 2, 4)}, probes)
    assert result.method == "hybrid"
    assert "script failed" in result.reason
    assert "Loop.cell.dg scripted" in result.reason
    assert "Loop.cell traced around them" in result.reason
    assert "Loop scripted around them" in result.reason
    assert isinstance(result.module.cell.dg, torch.jit.RecursiveScriptModule)
    assert "prim::If" in str(result.module.cell.dg.graph)
    for _, probe in probes:
        for expected, got in zip(model(probe["xs"]), result.module(probe["xs"]), strict=True):
            torch.testing.assert_close(got, expected)


def test_a_long_reason_is_cut_at_a_word_and_marked() -> None:
    # "... use a `NamedTuple` inste; scripted": cut mid-word, unmarked, read as said.
    from pipeline.formats.torchscript import _first_line

    said = _first_line("word " * 70 + "use a `NamedTuple` instead\nsecond line")
    assert said.endswith(" […]") and len(said) <= 305, said
    assert said.removesuffix(" […]").split(" ")[-1] == "word", said
    assert _first_line("short one\nsecond") == "short one"
