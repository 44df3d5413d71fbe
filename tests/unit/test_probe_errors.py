"""A probe or verify case that does not fit the model's inputs names itself and its file:
"Input 'x' must have shape (batch, 4), got (2, 5)" said neither (a user's trial)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.core.errors import InputSpecError
from pipeline.export import ExportConfig, export
from pipeline.zoo.spec import TensorSpec

SOURCE = """
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
"""


def test_a_probe_of_another_shape_is_named_with_its_file(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(SOURCE)
    probes = tmp_path / "probes.pt"
    torch.save({"fine": {"x": torch.zeros(3, 4)}, "wide": {"x": torch.zeros(2, 5)}}, probes)
    config = ExportConfig(
        model=f"{tmp_path / 'net.py'}:Net",
        inputs=[TensorSpec("x", ("batch", 4))],
        probes_file=probes,
        random_init=True,
        checkpoint=tmp_path / "art" / "checkpoint.pt",
        out_dir=tmp_path / "art" / "export",
        formats=("onnx",),
    )
    with pytest.raises(InputSpecError) as err:
        export(config)
    assert str(err.value) == (
        f"Probe 'wide' in {probes}: Input 'x' must have shape (batch, 4), got (2, 5)."
    )


def test_token_ids_with_no_declared_range_are_warned_of_at_export(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`--input ids:int64:batch,seq` (no range): the servers passed any id to the model; a
    served .pt2 aborted its worker on one past the vocabulary, three a minute stopped the
    KServe runtime, and export said nothing (a user's trial)."""
    from pipeline.export.guards import warn_unbounded
    from pipeline.zoo import resolve_entry
    from pipeline.zoo.user import parse_input

    (tmp_path / "net.py").write_text(SOURCE)
    model = f"{tmp_path / 'net.py'}:Net"
    for declared, warned in (("ids:int64:batch,seq", True), ("ids:int64:batch,seq:0:50", False)):
        caplog.clear()
        warn_unbounded(resolve_entry(model, inputs=[parse_input(declared)]))
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(said) == int(warned), (declared, said)
    warn_unbounded(resolve_entry(model, inputs=[parse_input("ids:int64:batch,seq")]))
    assert "input 'ids' (int64) has no declared range" in caplog.text
    assert "--input ids:...:0:VOCAB" in caplog.text
