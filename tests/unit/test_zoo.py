import pytest
import torch

from pipeline.core.errors import InputSpecError, UnknownModelError
from pipeline.zoo import get_entry, zoo_names
from pipeline.zoo.rnn import MyDecisionGate

GATED = ["my_decision_gate", "my_cell", "my_rnn_loop", "wrap_rnn"]


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(
        UnknownModelError, match=r"Unknown model 'resnet9000'.*digits_lenet.*module:ClassName"
    ):
        get_entry("resnet9000")


@pytest.mark.parametrize("name", zoo_names())
def test_entry_builds_and_runs_on_its_spec(name: str) -> None:
    entry = get_entry(name)
    model = entry.build().eval()
    inputs = entry.sample_inputs(entry.sizes(batch=3), torch.Generator().manual_seed(0))
    entry.check_inputs(inputs)
    out = model(*inputs.values())
    n_out = len(out) if isinstance(out, tuple) else 1
    assert n_out == len(entry.outputs)


@pytest.mark.parametrize("name", zoo_names())
def test_probes_cover_batch_one_and_more(name: str) -> None:
    entry = get_entry(name)
    probes = entry.probe_inputs(torch.Generator().manual_seed(0), entry.build().eval())
    batch_axis = {s.name: s.shape.index("batch") for s in entry.inputs}
    batches = {t.shape[batch_axis[k]] for _, p in probes for k, t in p.items()}
    assert 1 in batches
    assert max(batches) > 1
    for _, p in probes:
        entry.check_inputs(p)


@pytest.mark.parametrize("name", GATED)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_probes_drive_both_branches_of_every_gate(name: str, seed: int) -> None:
    """Whatever the weights (three seeds), the probes reach x.sum() > 0 and <= 0."""
    torch.manual_seed(seed)
    entry = get_entry(name)
    model = entry.build().eval()
    taken: set[bool] = set()
    for module in model.modules():
        if isinstance(module, MyDecisionGate):
            module.register_forward_pre_hook(lambda m, args: taken.add(bool(args[0].sum() > 0)))
    with torch.no_grad():
        for _, probe in entry.probe_inputs(torch.Generator().manual_seed(seed), model):
            model(*probe.values())
    assert taken == {True, False}


def test_sequence_probes_use_lengths_not_seen_at_export() -> None:
    entry = get_entry("wrap_rnn")
    lengths = {
        p["xs"].shape[0] for _, p in entry.probe_inputs(torch.Generator(), entry.build().eval())
    }
    assert entry.default_sizes["seq"] not in lengths
    assert {1, 13} <= lengths


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (torch.zeros(2, 1, 28, 28, dtype=torch.float64), "must be float32, got float64"),
        (torch.zeros(2, 3, 28, 28), r"must have shape \(batch, 1, 28, 28\), got \(2, 3, 28, 28\)"),
        (torch.zeros(1, 28, 28), "must have shape"),
    ],
)
def test_spec_check_names_the_problem(tensor: torch.Tensor, message: str) -> None:
    with pytest.raises(InputSpecError, match=message):
        get_entry("digits_lenet").check_inputs({"image": tensor})


def test_wrong_input_name() -> None:
    with pytest.raises(InputSpecError, match=r"takes inputs \['image'\]"):
        get_entry("digits_lenet").check_inputs({"x": torch.zeros(1, 1, 28, 28)})


@pytest.mark.parametrize("name", GATED)
def test_cond_formulation_computes_the_same_function(name: str) -> None:
    """Same parameters, same outputs, on both branches and on sequence lengths 1 to 13."""
    from pipeline.core.compare import flatten_outputs
    from pipeline.zoo.rnn import CondDecisionGate, ScanRNNLoop

    entry = get_entry(name)
    torch.manual_seed(1)
    model = entry.build().eval()
    twin = entry.cond_formulation(model).eval()
    assert twin.state_dict().keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(twin.state_dict()[key], value)
    assert not any(isinstance(m, MyDecisionGate) for m in twin.modules())
    assert any(isinstance(m, CondDecisionGate) for m in twin.modules())
    if name in ("my_rnn_loop", "wrap_rnn"):
        assert any(isinstance(m, ScanRNNLoop) for m in twin.modules())
    probes = entry.probe_inputs(torch.Generator().manual_seed(0), model)
    labels = " ".join(label for label, _ in probes)
    assert ("+" in labels or ">0" in labels) and ("-" in labels or "<0" in labels)
    with torch.no_grad():
        for label, inputs in probes:
            for got, want in zip(
                flatten_outputs(twin(*inputs.values())),
                flatten_outputs(model(*inputs.values())),
                strict=True,
            ):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=label)
    # The original is left untouched (the formulation is a copy).
    assert any(isinstance(m, MyDecisionGate) for m in model.modules())


def test_a_declared_integer_range_bounds_what_the_servers_accept() -> None:
    from pipeline.zoo.user import parse_input

    assert parse_input("tokens:int64:batch,seq:0:1000").record().to_json()["bounded"] is True
    assert parse_input("tokens:int64:batch,seq").bounded is False  # 0:10 only draws samples
    assert parse_input("x:float32:batch,4:-2:2").bounded is False  # floats are never bounded
    assert get_entry("lstm_tagger").inputs[0].bounded  # the vocabulary of 1,000


def test_output_axes_that_follow_an_input_axis_are_named_after_it() -> None:
    """The tagger's tag_logits were recorded (batch, 16, 9) from the golden run at 16 steps,
    and the served metadata told clients every answer had 16."""
    from torch import nn

    from pipeline.export.outshapes import output_shapes
    from pipeline_runtime.outputs import flatten_outputs

    entry = get_entry("lstm_tagger")
    model = entry.build().eval()
    golden = entry.golden_inputs(torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = flatten_outputs(model(*golden.values()))
    assert output_shapes(entry, model, golden, outputs) == {"tag_logits": ("batch", "seq", 9)}

    class Doubled(nn.Module):  # an axis that moves with none of the inputs' own
        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return torch.cat([tokens, tokens], 1).float()

    doubled = flatten_outputs(Doubled()(*golden.values()))
    shapes = output_shapes(entry, Doubled(), golden, doubled)
    assert shapes == {"tag_logits": ("batch", "tag_logits_1")}
