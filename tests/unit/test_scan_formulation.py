"""nn.LSTM / nn.GRU / nn.RNN as `scan` (pipeline/formats/recurrent.py): the same numbers as the
library layer for every configuration it covers, the same parameters, clear refusals, and a
torch.export program whose sequence axis stays dynamic."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from pipeline.core.errors import ExportError
from pipeline.export.config import parse_fix_axes
from pipeline.formats.recurrent import (
    RecurrentInputError,
    ScanRecurrent,
    refusal,
    scan_formulation,
)


def _layer(kind: str, **kw: object) -> nn.RNNBase:
    if kind == "relu":
        return nn.RNN(5, 6, nonlinearity="relu", **kw)
    return {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind](5, 6, **kw)


def _leaves(out: object) -> list[torch.Tensor]:
    return torch.utils._pytree.tree_leaves(out)


# (kind, layers, bidirectional, batch_first, bias, proj_size, unbatched): every option
# covered at least once; each case compiles its scans (eager `scan` runs through dynamo).
CONFIGS = [
    ("lstm", 2, True, True, True, 0, False),
    ("gru", 2, True, True, True, 0, True),
    ("rnn", 2, True, False, True, 0, False),
    ("relu", 1, False, True, True, 0, True),
    ("lstm", 1, False, False, False, 3, True),
    ("lstm", 2, True, True, True, 3, False),
    ("gru", 1, True, False, False, 0, False),
]


@pytest.mark.parametrize(("kind", "layers", "bi", "first", "bias", "proj", "unbatched"), CONFIGS)
def test_the_scan_formulation_computes_what_the_layer_computes(
    kind: str, layers: int, bi: bool, first: bool, bias: bool, proj: int, unbatched: bool
) -> None:
    torch.manual_seed(layers * 7 + bi + 2 * first + 4 * bias + proj)
    kw: dict[str, object] = {"num_layers": layers, "bidirectional": bi, "batch_first": first}
    kw |= {"bias": bias, "dropout": 0.5 if layers > 1 else 0.0}  # dropout: off in eval
    if proj:
        kw["proj_size"] = proj
    layer = _layer(kind, **kw).eval()
    scanned = ScanRecurrent(layer).eval()
    states = layers * (2 if bi else 1)
    # Without initial states, batched; then with them given, one step (unbatched or not).
    for length, no_batch, given in ((7, False, False), (1, unbatched, True)):
        shape = (length, 5) if no_batch else ((3, length, 5) if first else (length, 3, 5))
        x = torch.randn(shape)
        args: tuple = (x,)
        if given:  # initial states supplied by the caller
            lead = (states,) if no_batch else (states, 3)
            h0 = torch.randn(*lead, proj or 6)
            args = (x, (h0, torch.randn(*lead, 6))) if kind == "lstm" else (x, h0)
        with torch.no_grad():
            want, got = _leaves(layer(*args)), _leaves(scanned(*args))
        assert [t.shape for t in got] == [t.shape for t in want]
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_the_formulation_shares_the_weights_and_leaves_the_model_alone() -> None:
    model = nn.Sequential(nn.Linear(3, 5), nn.GRU(5, 4, num_layers=2, bidirectional=True))
    formulation = scan_formulation(model)
    assert formulation is not None
    assert [s.describe() for s in formulation.swaps] == ["1: nn.GRU → scan formulation"]
    assert isinstance(model[1], nn.GRU)  # the original is untouched
    twin = formulation.model
    assert isinstance(twin[1], ScanRecurrent)
    assert list(twin.state_dict()) == list(model.state_dict())
    assert twin[1].weight_hh_l1_reverse is model[1].weight_hh_l1_reverse  # the same tensor
    assert scan_formulation(nn.Linear(2, 2)) is None


class _OwnForward(nn.LSTM):
    def forward(self, x, hx=None):  # type: ignore[override]
        return super().forward(x * 2, hx)


def test_layers_that_cannot_be_rewritten_are_kept_with_the_reason() -> None:
    assert "has its own forward" in (refusal(_OwnForward(3, 3)) or "")
    normed = nn.utils.parametrizations.weight_norm(nn.GRU(3, 3), "weight_hh_l0")
    assert "parametrized" in (refusal(normed) or "")
    assert "training mode with dropout" in (refusal(nn.LSTM(3, 3, 2, dropout=0.2).train()) or "")
    assert refusal(nn.LSTM(3, 3, 2, dropout=0.2).eval()) is None
    model = nn.Sequential(_OwnForward(3, 3))
    formulation = scan_formulation(model)
    assert formulation is not None and formulation.model is model and not formulation.replaced
    assert "0: _OwnForward(3, 3) kept (_OwnForward has its own forward" in (
        formulation.kept[0].describe()
    )


def test_a_packed_sequence_is_refused_with_what_to_do() -> None:
    scanned = ScanRecurrent(nn.LSTM(3, 4, batch_first=True).eval())
    packed = pack_padded_sequence(torch.randn(2, 5, 3), torch.tensor([5, 3]), batch_first=True)
    with pytest.raises(RecurrentInputError, match="PackedSequence") as err:
        scanned(packed)
    assert "nn.LSTM(3, 4, batch_first=True)" in str(err.value)
    assert "--fix-axis" in str(err.value)


class _Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 6)
        self.rnn = nn.LSTM(6, 5, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(10, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.embed(tokens))[0])


def test_torch_export_keeps_the_sequence_axis_of_the_formulation_dynamic() -> None:
    """The library layer fixes `seq` under torch.export; its scan formulation does not."""
    torch.manual_seed(0)
    model = _Tagger().eval()
    tokens = torch.randint(0, 50, (2, 5))
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},)
    with pytest.raises(Exception, match=r"Constraints violated \(seq\)"):
        torch.export.export(model, (tokens,), dynamic_shapes=dims, strict=False)
    formulation = scan_formulation(model)
    assert formulation is not None
    program = torch.export.export(formulation.model, (tokens,), dynamic_shapes=dims, strict=False)
    for batch, length in ((1, 1), (3, 15)):
        x = torch.randint(0, 50, (batch, length))
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), model(x), atol=1e-6, rtol=1e-5)


def test_fix_axis_values_are_axis_equals_a_positive_size() -> None:
    assert parse_fix_axes(["seq=32", " time = 4"]) == {"seq": 32, "time": 4}
    for bad in ("seq", "seq=0", "=4", "seq=-1", "seq=x", "seq=²"):  # "²": isdigit(), not int()
        with pytest.raises(ExportError, match="write AXIS=N"):
            parse_fix_axes([bad])
