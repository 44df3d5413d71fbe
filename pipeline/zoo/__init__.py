"""The model zoo: built-in models by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.defaults import DEFAULT_MODEL  # defined torch-free, for the CLI
from pipeline.core.errors import InputArgumentError, UnknownModelError
from pipeline.core.paths import is_external
from pipeline.zoo import recurrent, rnn
from pipeline.zoo.data import DIGITS_CLASSES, DIGITS_SIZE, digits_sample
from pipeline.zoo.lenet import DigitsLeNet, DigitsMLP
from pipeline.zoo.spec import Inputs, TensorSpec, ZooEntry
from pipeline.zoo.user import _file_probes, external_entry

__all__ = [
    "DEFAULT_MODEL",
    "Inputs",
    "TensorSpec",
    "ZooEntry",
    "get_entry",
    "resolve_entry",
    "zoo_names",
]


def _digits_golden() -> Inputs:
    return {"image": digits_sample(8)}


def _digits_probes(generator: torch.Generator, model: nn.Module) -> list[tuple[str, Inputs]]:
    # No control flow to drive; probes cover batch sizes 1 and >1 on real
    # images and the extremes of the input range.
    return [
        ("real b=1", {"image": digits_sample(1, offset=100)}),
        ("real b=5", {"image": digits_sample(5, offset=200)}),
        ("zeros b=2", {"image": torch.zeros(2, 1, DIGITS_SIZE, DIGITS_SIZE)}),
        ("ones b=3", {"image": torch.ones(3, 1, DIGITS_SIZE, DIGITS_SIZE)}),
    ]


def _gate_probes(generator: torch.Generator, model: nn.Module) -> list[tuple[str, Inputs]]:
    r = torch.rand(3, 4, generator=generator)
    mixed = torch.randn(3, 4, generator=generator)
    mixed_pos = mixed - mixed.mean() + 0.25  # mixed signs, positive sum
    return [
        ("sum>0 b=1", {"x": r[:1] + 0.1}),
        ("sum<0 b=1", {"x": -(r[:1] + 0.1)}),
        ("sum>0 b=3", {"x": r + 0.1}),
        ("sum<0 b=3", {"x": -(r + 0.1)}),
        ("mixed sum>0 b=3", {"x": mixed_pos}),
        ("mixed sum<0 b=3", {"x": -mixed_pos}),
        ("zeros b=2", {"x": torch.zeros(2, 4)}),
    ]


def _steps(
    linear: nn.Linear, signs: list[int], batch: int, generator: torch.Generator
) -> torch.Tensor:
    """(len(signs), batch, 4) inputs whose step t drives the gate to sign signs[t].

    Each step is ±k·u (u, k from `rnn.gate_direction`/`gate_scale`) times a
    per-sample factor in [1, 1.5), plus noise orthogonal to u, which leaves
    the gate's input sum unchanged.
    """
    u, k = rnn.gate_direction(linear), rnn.gate_scale(linear)
    t = len(signs)
    scale = 1.0 + 0.5 * torch.rand(t, batch, 1, generator=generator)
    noise = torch.randn(t, batch, u.numel(), generator=generator)
    noise = noise - (noise @ u).unsqueeze(-1) * u  # remove the component along u
    sign = torch.tensor(signs, dtype=torch.float32).view(t, 1, 1)
    return sign * k * scale * u + noise


def _cell_of(model: nn.Module) -> rnn.MyCell:
    for module in model.modules():
        if isinstance(module, rnn.MyCell):
            return module
    raise TypeError(f"{type(model).__name__} holds no MyCell")


def _cell_probes(generator: torch.Generator, model: nn.Module) -> list[tuple[str, Inputs]]:
    linear = _cell_of(model).linear
    probes = []
    for batch in (1, 3):
        h = torch.tanh(torch.randn(batch, 4, generator=generator))
        for sign, label in ((1, "gate+"), (-1, "gate-")):
            x = _steps(linear, [sign], batch, generator)[0]
            probes.append((f"{label} b={batch}", {"x": x, "h": h}))
    return probes


def _sequence_probes(generator: torch.Generator, model: nn.Module) -> list[tuple[str, Inputs]]:
    # Sequence lengths 1, 3 and 13 are not the length golden/export inputs use (6).
    linear = _cell_of(model).linear
    cases = [
        ("all gate+ seq=3 b=1", [1, 1, 1], 1),
        ("all gate- seq=3 b=4", [-1, -1, -1], 4),
        ("alternating seq=13 b=2", [1 if i % 2 else -1 for i in range(13)], 2),
        ("gate- seq=1 b=1", [-1], 1),
        ("gate+ seq=1 b=3", [1], 3),
    ]
    return [(label, {"xs": _steps(linear, signs, b, generator)}) for label, signs, b in cases]


def _length_probes(specs: tuple[TensorSpec, ...], cases: tuple[tuple[int, int], ...]) -> Any:
    """Probes at (batch, seq) sizes: the sequence shorter and longer than the example's."""

    def probes(generator: torch.Generator, model: nn.Module) -> list[tuple[str, Inputs]]:
        return [
            (f"b={b} seq={n}", {s.name: s.sample({"batch": b, "seq": n}, generator) for s in specs})
            for b, n in cases
        ]

    return probes


# The recurrent models' example is 16 steps; probes go down to 1 step and up to 3×.
_RECURRENT_SIZES = {"batch": 2, "seq": 16}
_RECURRENT_PROBES = ((1, 1), (3, 5), (2, 48))
_TOKENS = (TensorSpec("tokens", ("batch", "seq"), torch.int64, 0, 1000, bounded=True),)
_FRAMES = (TensorSpec("frames", ("batch", "seq", 20), low=-1.0, high=1.0),)


# The gate sums over the whole batch, so stacking several clients' requests
# into one forward pass could flip a request's branch: serve them one by one.
_BATCH_COUPLED = {"stack_requests": False}

_VEC = (TensorSpec("x", ("batch", rnn.HIDDEN), low=-1.0, high=1.0),)
_SEQ = (TensorSpec("xs", ("seq", "batch", rnn.HIDDEN), low=-1.0, high=1.0),)


def _digits_entry(name: str, description: str, builder: Any, kwargs: dict[str, Any]) -> ZooEntry:
    """A classifier of the 1×28×28 digits: same data, probes and serving contract."""
    return ZooEntry(
        name=name,
        description=description,
        builder=builder,
        kwargs=kwargs,
        inputs=(TensorSpec("image", ("batch", 1, DIGITS_SIZE, DIGITS_SIZE)),),
        outputs=("logits",),
        task="digits",
        golden=_digits_golden,
        probes=_digits_probes,
        serving={"image": {"size": DIGITS_SIZE}, "topk": 3},
    )


_ENTRIES: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        _digits_entry(
            "digits_lenet",
            "LeNet-style CNN (BatchNorm + Dropout) for scikit-learn's digits at 28×28",
            DigitsLeNet,
            {"num_classes": DIGITS_CLASSES, "dropout": 0.25},
        ),
        _digits_entry(
            "digits_mlp",
            "BatchNorm-free MLP for the digits: the exact reference for multi-process training",
            DigitsMLP,
            {"num_classes": DIGITS_CLASSES, "hidden": 128},
        ),
        ZooEntry(
            name="my_decision_gate",
            description="TorchScript tutorial gate: x if x.sum() > 0 else -x (no parameters)",
            builder=rnn.MyDecisionGate,
            inputs=_VEC,
            outputs=("y",),
            task=None,
            probes=_gate_probes,
            serving=_BATCH_COUPLED,
            cond_formulation=rnn.cond_formulation,
        ),
        ZooEntry(
            name="my_cell",
            description="TorchScript tutorial cell: tanh(gate(Linear(4, 4)(x)) + h), returns (h, h)",
            builder=rnn.MyCell,
            inputs=(*_VEC, TensorSpec("h", ("batch", rnn.HIDDEN), low=-1.0, high=1.0)),
            outputs=("y", "h_next"),
            task="rnn_teacher_step",
            train_defaults={"lr": 3e-2},
            probes=_cell_probes,
            serving=_BATCH_COUPLED,
            cond_formulation=rnn.cond_formulation,
        ),
        ZooEntry(
            name="my_rnn_loop",
            description="TorchScript tutorial loop: the cell over a (seq, batch, 4) sequence",
            builder=rnn.MyRNNLoop,
            inputs=_SEQ,
            outputs=("y", "h"),
            task="rnn_teacher_seq",
            train_defaults={"lr": 3e-2},
            default_sizes={"seq": 6, "batch": 3},
            probes=_sequence_probes,
            serving=_BATCH_COUPLED,
            cond_formulation=rnn.cond_formulation,
        ),
        ZooEntry(
            name="wrap_rnn",
            description="TorchScript tutorial WrapRNN: the loop, then ReLU",
            builder=rnn.WrapRNN,
            inputs=_SEQ,
            outputs=("y",),
            task="rnn_teacher_seq",
            train_defaults={"lr": 3e-2},
            default_sizes={"seq": 6, "batch": 3},
            probes=_sequence_probes,
            serving=_BATCH_COUPLED,
            cond_formulation=rnn.cond_formulation,
        ),
        ZooEntry(
            name="lstm_tagger",
            description="token tagger: Embedding → 2-layer bidirectional nn.LSTM → Linear "
            "(sequence axis dynamic; random init)",
            builder=recurrent.LstmTagger,
            inputs=_TOKENS,
            outputs=("tag_logits",),
            task=None,
            default_sizes=_RECURRENT_SIZES,
            probes=_length_probes(_TOKENS, _RECURRENT_PROBES),
        ),
        ZooEntry(
            name="gru_encoder",
            description="sequence encoder: 2-layer bidirectional nn.GRU over feature frames → "
            "one vector (sequence axis dynamic; random init)",
            builder=recurrent.GruEncoder,
            inputs=_FRAMES,
            outputs=("embedding",),
            task=None,
            default_sizes=_RECURRENT_SIZES,
            probes=_length_probes(_FRAMES, _RECURRENT_PROBES),
        ),
    ]
}


def zoo_names() -> list[str]:
    return list(_ENTRIES)


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called `name`, or a clear error listing the known names."""
    try:
        return _ENTRIES[name]
    except KeyError:
        raise UnknownModelError(
            f"Unknown model {name!r}. Known models: {', '.join(zoo_names())}. "
            "Run `pipeline models` to see what each one is; your own model can be given as "
            "package.module:ClassName or path/to/file.py:ClassName, and torchvision "
            "classifiers as torchvision:NAME."
        ) from None


def resolve_entry(
    name: str,
    *,
    kwargs: dict[str, Any] | None = None,
    inputs: Sequence[TensorSpec] | None = None,
    outputs: Sequence[str] | None = None,
    probes_file: Path | None = None,
) -> ZooEntry:
    """A zoo name, `module:Class`, `file.py:Class` or `torchvision:NAME` → its entry."""
    if is_external(name):
        return external_entry(
            name, kwargs=kwargs, inputs=inputs, outputs=outputs, probes_file=probes_file
        )
    entry = get_entry(name)
    if inputs or outputs:
        raise InputArgumentError(
            f"{name!r} is a zoo model with a fixed input spec; --input/--input-spec/--output "
            "are for models given as module:Class."
        )
    if kwargs and any(entry.kwargs.get(k, object()) != v for k, v in kwargs.items()):
        # Their data, probes and input specs are built for these arguments.
        raise InputArgumentError(
            f"{name!r} is a zoo model with fixed constructor arguments {dict(entry.kwargs)}; "
            "--model-kwargs is for models given as module:Class (copy the zoo class into your "
            "own module to change it)."
        )
    changes: dict[str, Any] = {}
    if probes_file:
        changes["probes"] = _file_probes(probes_file)
    return replace(entry, **changes) if changes else entry
