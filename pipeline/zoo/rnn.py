"""The control-flow family from PyTorch's TorchScript tutorial.

`MyDecisionGate` branches on data (`x.sum() > 0`), `MyCell` calls it,
`MyRNNLoop` loops over a sequence of any length, `WrapRNN` wraps the loop. A
plain `torch.jit.trace` of any of them is silently wrong for inputs that take
the other branch or have another sequence length; they are the test bed for
the export stage's trace/script/hybrid choice.

Unlike the tutorial, the modules here are plain eager modules (no
`torch.jit` calls in `__init__`): choosing how to compile them is the export
stage's job. The hidden state is sized from the input, so the batch is dynamic.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch._higher_order_ops.scan import scan

HIDDEN = 4  # the tutorial's Linear(4, 4)


class MyDecisionGate(nn.Module):
    """Identity for inputs whose sum is positive, negation otherwise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x
        else:
            return -x


class MyCell(nn.Module):
    """Linear(4, 4) → gate → tanh(· + h); returns (new_h, new_h) as in the tutorial."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.dg = MyDecisionGate()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new_h = torch.tanh(self.dg(self.linear(x)) + h)
        return new_h, new_h


class MyRNNLoop(nn.Module):
    """Runs the cell over `xs` shaped (seq, batch, hidden); returns (y, h)."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = MyCell(hidden)

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(xs.size(1), self.hidden, dtype=xs.dtype, device=xs.device)
        y = h
        for i in range(xs.size(0)):
            y, h = self.cell(xs[i], h)
        return y, h


class WrapRNN(nn.Module):
    """The loop followed by ReLU."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.loop = MyRNNLoop(hidden)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        y, _ = self.loop(xs)
        return torch.relu(y)


# --- the torch.export formulation ---------------------------------------------
# torch.export cannot follow a Python `if` on a tensor's value, and it unrolls
# a Python loop over `xs.size(0)` (fixing the sequence length). The modules
# below compute exactly what the ones above compute, with the branch as
# `torch.cond` and the loop as `scan`, so torch.export, AOTInductor and the
# default ONNX exporter (ONNX `If` and `Scan`) keep both. They hold the same
# parameters under the same names: `cond_formulation` swaps them in.


def _same(x: torch.Tensor) -> torch.Tensor:
    # A clone, not `x`: a torch.cond branch may not return its input unchanged
    # (../shared/DESIGN.md).
    return x.clone()


def _negated(x: torch.Tensor) -> torch.Tensor:
    return -x


class CondDecisionGate(nn.Module):
    """`MyDecisionGate` with its branch as `torch.cond`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, _same, _negated, (x,))


class ScanRNNLoop(nn.Module):
    """`MyRNNLoop` with its loop as `scan` over the (dynamic) sequence axis.

    Only the state is carried: `MyCell` returns its new state as its output, so
    the loop's `y` is its final `h` (and both are zeros for an empty sequence).
    Carrying one tensor is deliberate: with `y` carried as well, AOTInductor
    (torch 2.14, CPU) compiled a program that crashed, and with the per-step
    outputs stacked its scan lowering failed on the dynamic batch size; so the
    per-step output is a scalar placeholder.
    """

    def __init__(self, cell: nn.Module, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = cell

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h0 = torch.zeros(xs.size(1), self.hidden, dtype=xs.dtype, device=xs.device)

        def step(h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            _, new_h = self.cell(x, h)
            return new_h.clone(), new_h.new_zeros(())

        h, _ = scan(step, h0, xs)
        return h, h.clone()


def cond_formulation(model: nn.Module) -> nn.Module:
    """A copy of `model` (any of this family) that torch.export can take whole.

    Every `MyDecisionGate` becomes a `CondDecisionGate` and every `MyRNNLoop` a
    `ScanRNNLoop` around the same cell; parameters are copied, so the result
    computes the same function as `model` and its state_dict is the same.
    """
    if isinstance(model, MyDecisionGate):
        return CondDecisionGate()
    if isinstance(model, MyRNNLoop):
        return ScanRNNLoop(cond_formulation(model.cell), model.hidden).train(model.training)
    twin = copy.deepcopy(model)
    for name, child in list(twin.named_children()):
        setattr(twin, name, cond_formulation(child))
    return twin


def gate_direction(linear: nn.Linear) -> torch.Tensor:
    """A unit input direction u with sum(linear(k·u)) growing with k.

    sum_j (W x + b)_j = (Wᵀ1)·x + Σb, so x = ±k·Wᵀ1/|Wᵀ1| drives the gate's
    input sum to either sign for k large enough: probes use it to hit both
    branches whatever the trained weights are.
    """
    w = linear.weight.detach().sum(dim=0)
    norm = w.norm()
    if float(norm) < 1e-12:  # degenerate weights: any direction is as good
        return torch.ones_like(w) / w.numel() ** 0.5
    return w / norm


def gate_scale(linear: nn.Linear) -> float:
    """A magnitude k that makes the gate's sign follow the input's sign."""
    u = gate_direction(linear)
    slope = float(linear.weight.detach().sum(dim=0) @ u)
    offset = abs(float(linear.bias.detach().sum())) if linear.bias is not None else 0.0
    return max(1.0, 2.0 * (offset + 1.0) / max(slope, 1e-6))
