"""nn.LSTM, nn.GRU and nn.RNN as `scan`, so torch.export keeps their sequence axis dynamic.

torch.export (torch 2.14) lowers the library's recurrent layers step by step,
so a dynamic sequence axis is specialised to the example's length
("Constraints violated (seq)"), whatever the user's own code does. The modules
here compute what those layers compute with the time loop as
`torch._higher_order_ops.scan`, over the same parameters (the same tensors,
under the same names), so the export stage swaps them in for torch.export-based
formats (`.pt2`) and records the swap ("rnn: nn.LSTM → scan formulation").

Covered: any number of layers, bidirectional, `batch_first`, unbatched input,
`bias=False`, LSTM `proj_size`, RNN tanh/relu, dropout in eval mode, initial
states given (they stay inputs). Refused, each with the reason: PackedSequence
input (at export, when the layer is called with one), subclasses with their own
`forward`, parametrized weights (weight_norm and the like), and dropout in
training mode.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._higher_order_ops.scan import scan
from torch.nn.utils import parametrize
from torch.nn.utils.rnn import PackedSequence

from pipeline.core.errors import ExportError

# The layers replaced, with the number of gates their weights stack (PyTorch's order:
# LSTM i, f, g, o; GRU r, z, n).
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
LAYERS: tuple[type[nn.RNNBase], ...] = (nn.LSTM, nn.GRU, nn.RNN)


class RecurrentInputError(ExportError):
    """A replaced layer was called with something the scan formulation does not take."""


def describe(module: nn.Module) -> str:
    """`nn.LSTM(16, 24, num_layers=2, batch_first=True, bidirectional=True)`."""
    prefix = "nn." if type(module) in LAYERS else ""
    return prefix + repr(module).replace("\n", " ")


def kind(module: nn.Module) -> str:
    """The library layer a module is (`nn.LSTM`), for the export line."""
    base = next((cls for cls in LAYERS if isinstance(module, cls)), type(module))
    return f"nn.{base.__name__}"


def refusal(module: nn.Module) -> str | None:
    """Why `module` (an nn.RNNBase) cannot be replaced, or None when it can."""
    base = next((cls for cls in LAYERS if isinstance(module, cls)), None)
    if base is None:
        return f"{type(module).__name__} is not nn.LSTM, nn.GRU or nn.RNN"
    if type(module).forward is not base.forward:
        return f"{type(module).__name__} has its own forward; only the library's is rewritten"
    if parametrize.is_parametrized(module):
        return "its weights are parametrized (weight_norm or similar)"
    if module.training and module.dropout > 0:
        return "it is in training mode with dropout"
    if module.mode not in GATES:
        return f"mode {module.mode!r} is not known"
    return None


class ScanRecurrent(nn.Module):
    """A library recurrent layer's computation with each direction of each layer a `scan`.

    Holds the original's parameters themselves (same names, so the same
    state_dict) and answers the same call: `(input, hx=None)` → `(output, h_n)`,
    or `(output, (h_n, c_n))` for an LSTM.
    """

    def __init__(self, original: nn.RNNBase) -> None:
        super().__init__()
        why = refusal(original)
        if why is not None:
            raise ValueError(f"{describe(original)} cannot be replaced: {why}")
        self.described = describe(original)
        self.mode = original.mode
        for attr in ("input_size", "hidden_size", "num_layers", "bias", "batch_first"):
            setattr(self, attr, getattr(original, attr))
        self.bidirectional, self.dropout = original.bidirectional, original.dropout
        self.proj_size = getattr(original, "proj_size", 0)
        for name, param in original.named_parameters(recurse=False):
            self.register_parameter(name, param)
        self.train(original.training)

    def flatten_parameters(self) -> None:
        """nn.RNNBase's cuDNN hint, which models call in forward: nothing to do here."""

    def extra_repr(self) -> str:
        return f"scan formulation of {self.described}"

    def forward(self, input: Any, hx: Any = None) -> tuple[torch.Tensor, Any]:
        if isinstance(input, PackedSequence):
            raise RecurrentInputError(
                f"{self.described} was called with a PackedSequence, which torch.export cannot "
                "take (its lengths decide the loop): pass the padded batch instead, or export "
                "with --fix-axis to keep the library layer at one sequence length."
            )
        unbatched = input.dim() == 2
        x = input.unsqueeze(1) if unbatched else input
        if self.batch_first and not unbatched:
            x = x.transpose(0, 1)
        lstm = self.mode == "LSTM"
        h0, c0 = (hx if hx is not None else (None, None)) if lstm else (hx, None)
        if unbatched:
            h0 = None if h0 is None else h0.unsqueeze(1)
            c0 = None if c0 is None else c0.unsqueeze(1)
        directions = 2 if self.bidirectional else 1
        batch = x.size(1)
        out_size = self.proj_size or self.hidden_size
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for d in range(directions):
                i = layer * directions + d
                h = x.new_zeros(batch, out_size) if h0 is None else h0[i]
                c = None
                if lstm:
                    c = x.new_zeros(batch, self.hidden_size) if c0 is None else c0[i]
                ys, h, c = self._direction(x, h, c, layer, d == 1, batch)
                outputs.append(ys)
                h_n.append(h)
                c_n.append(c)
            x = outputs[0] if directions == 1 else torch.cat(outputs, dim=-1)
        out = x.transpose(0, 1) if self.batch_first and not unbatched else x
        h_last = torch.stack(h_n)
        c_last = torch.stack(c_n) if lstm else None
        if unbatched:
            out, h_last = out.squeeze(1), h_last.squeeze(1)
            c_last = None if c_last is None else c_last.squeeze(1)
        return (out, (h_last, c_last)) if lstm else (out, h_last)

    def _weights(self, layer: int, reverse: bool) -> dict[str, torch.Tensor | None]:
        suffix = f"_l{layer}" + ("_reverse" if reverse else "")
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
        return {n: getattr(self, n + suffix, None) for n in names}

    def _direction(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        c: torch.Tensor | None,
        layer: int,
        reverse: bool,
        batch: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One direction of one layer over x (seq, batch, features) → (ys, h_n, c_n)."""
        w = self._weights(layer, reverse)
        gru = self.mode == "GRU"
        # The input's share of every step at once, one matmul over the sequence; the
        # hidden bias joins it except for GRU, whose n gate multiplies it by r.
        xw = x @ w["weight_ih"].t()
        if w["bias_ih"] is not None:
            xw = xw + w["bias_ih"]
            if not gru:
                xw = xw + w["bias_hh"]
        w_hh, b_hh, w_hr = w["weight_hh"], w["bias_hh"], w["weight_hr"]
        mode, width = self.mode, h.size(-1)

        # Each step's output is reshaped with `batch`, a size from outside the step:
        # that makes torch.export hand the batch size to the scan, which AOTInductor's
        # lowering needs to allocate the stacked outputs when the batch is dynamic
        # (without it: InductorError KeyError on the batch's symbol, torch 2.14).
        def step(carry: Any, xt: torch.Tensor) -> tuple[Any, torch.Tensor]:
            h = carry[0]
            if mode == "LSTM":
                i, f, g, o = (xt + h @ w_hh.t()).chunk(4, dim=-1)
                c = torch.sigmoid(f) * carry[1] + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                if w_hr is not None:
                    h = h @ w_hr.t()
                return (h, c), h.reshape(batch, width).clone()
            if mode == "GRU":
                hw = h @ w_hh.t()
                if b_hh is not None:
                    hw = hw + b_hh
                xr, xz, xn = xt.chunk(3, dim=-1)
                hr, hz, hn = hw.chunk(3, dim=-1)
                r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                h = (1 - z) * torch.tanh(xn + r * hn) + z * h
            else:
                pre = xt + h @ w_hh.t()
                h = torch.tanh(pre) if mode == "RNN_TANH" else torch.relu(pre)
            return (h,), h.reshape(batch, width).clone()

        carry = (h, c) if mode == "LSTM" else (h,)
        last, ys = scan(step, carry, xw, reverse=reverse)
        return ys, last[0], (last[1] if mode == "LSTM" else None)


@dataclass(frozen=True)
class Swap:
    """One recurrent layer found in a model: replaced, or why not."""

    path: str  # its name in the model ("encoder.rnn"; "" for the model itself)
    described: str  # "nn.LSTM(16, 24, num_layers=2, bidirectional=True)"
    kind: str  # "nn.LSTM"
    refused: str | None = None  # why it was left as it is

    def describe(self) -> str:
        where = self.path or "(the model)"
        if self.refused is None:
            return f"{where}: {self.kind} → scan formulation"
        return f"{where}: {self.described} kept ({self.refused})"

    def to_json(self) -> dict[str, Any]:
        return {"module": self.path, "layer": self.described, "replaced": self.refused is None} | (
            {"why_not": self.refused} if self.refused else {}
        )


@dataclass(frozen=True)
class Formulation:
    model: nn.Module  # the model with every replaceable layer swapped (shares its weights)
    swaps: tuple[Swap, ...]

    @property
    def replaced(self) -> tuple[Swap, ...]:
        return tuple(s for s in self.swaps if s.refused is None)

    @property
    def kept(self) -> tuple[Swap, ...]:
        return tuple(s for s in self.swaps if s.refused is not None)


def scan_formulation(model: nn.Module) -> Formulation | None:
    """`model` with its nn.LSTM/GRU/RNN layers as ScanRecurrent; None when it has none.

    The model itself is not changed: the result is a copy of its modules that
    holds the very same parameter and buffer tensors.
    """
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.RNNBase)]
    if not found:
        return None
    swaps = tuple(Swap(name, describe(m), kind(m), refusal(m)) for name, m in found)
    if all(s.refused for s in swaps):
        return Formulation(model, swaps)
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, shared)
    for swap in swaps:
        if swap.refused is not None:
            continue
        scanned = ScanRecurrent(twin.get_submodule(swap.path))
        if not swap.path:
            twin = scanned
            continue
        parent, _, child = swap.path.rpartition(".")
        setattr(twin.get_submodule(parent), child, scanned)
    return Formulation(twin, swaps)
