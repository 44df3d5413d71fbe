import pytest
import torch

from pipeline.errors import InputSpecError, UnknownModelError
from pipeline.zoo import get_entry, zoo_names


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(UnknownModelError, match=r"Unknown model 'resnet9000'.*digits_lenet"):
        get_entry("resnet9000")


def test_digits_entry_builds_and_runs_on_its_spec() -> None:
    entry = get_entry("digits_lenet")
    assert "digits_lenet" in zoo_names()
    model = entry.build().eval()
    inputs = entry.sample_inputs({"batch": 3}, torch.Generator().manual_seed(0))
    entry.check_inputs(inputs)
    assert model(*inputs.values()).shape == (3, 10)


def test_probes_cover_batch_one_and_more() -> None:
    entry = get_entry("digits_lenet")
    batches = {next(iter(p.values())).shape[0] for _, p in entry.probe_inputs(torch.Generator())}
    assert 1 in batches and max(batches) > 1


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
