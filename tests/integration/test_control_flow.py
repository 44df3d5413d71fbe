"""The TorchScript tutorial's control-flow family: trained, exported, verified."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

from pipeline.export import ExportConfig, ExportResult, export
from pipeline.verify import VerifyConfig, verify
from tests.conftest import FAMILY


@pytest.mark.parametrize("name", FAMILY)
def test_auto_rejects_the_trace_and_scripts(family: dict[str, ExportResult], name: str) -> None:
    ts = family[name].manifest.to_json()["artifacts"]["torchscript"]
    assert ts["method"] == "script"
    assert "trace rejected: TracerWarning at" in ts["reason"]
    assert "rnn.py:" in ts["reason"]
    assert "if x.sum() > 0" in ts["reason"]


@pytest.mark.parametrize("name", FAMILY)
def test_onnx_keeps_control_flow_and_dynamic_axes(
    family: dict[str, ExportResult], name: str
) -> None:
    art = family[name].manifest.to_json()["artifacts"]["onnx"]
    # The default exporter, on the zoo's torch.cond formulation: no legacy exporter.
    assert art["exporter"] == "torch.export (dynamo=True), torch.cond formulation"
    assert "the default exporter failed on the model as written" in art["reason"]
    model = onnx.load(str(family[name].out_dir / "model.onnx"))

    def op_types(graph: onnx.GraphProto) -> set[str]:
        ops = set()
        for node in graph.node:
            ops.add(node.op_type)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    ops |= op_types(attr.g)
        return ops

    ops = op_types(model.graph)
    assert "If" in ops
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if name in ("my_rnn_loop", "wrap_rnn"):
        assert "Scan" in ops
        assert dims == ["seq", "batch", 4]
    else:
        assert dims == ["batch", 4]


@pytest.mark.parametrize("name", FAMILY)
def test_verify_passes_on_both_branches_and_new_lengths(
    family: dict[str, ExportResult], name: str, tmp_path: Path
) -> None:
    report = verify(
        VerifyConfig(model=name, export_dir=family[name].out_dir, report=tmp_path / "p.json")
    )
    assert report.passed, report.failure_message()
    cases = {r.inputs for r in report.rows}
    assert {r.backend for r in report.rows} >= {"torchscript", "onnxruntime"}
    if name == "my_decision_gate":
        assert {"probe sum>0 b=1", "probe sum<0 b=3"} <= cases
    else:
        assert any("gate+" in c for c in cases)
        assert any("gate-" in c for c in cases)
    if name in ("my_rnn_loop", "wrap_rnn"):
        assert any("seq=13" in c for c in cases)  # export used seq=6


def test_rnn_training_loss_falls(family: dict[str, ExportResult]) -> None:
    for name in ("my_cell", "my_rnn_loop", "wrap_rnn"):
        history = family[name].manifest.checkpoint.metrics
        assert history["val_loss"] < 0.05, name


def test_unsafe_trace_is_exported_but_verify_shows_the_mismatch(
    family: dict[str, ExportResult], tmp_path: Path
) -> None:
    ckpt = family["my_rnn_loop"].out_dir / family["my_rnn_loop"].manifest.checkpoint.path
    result = export(
        ExportConfig(
            model="my_rnn_loop",
            checkpoint=ckpt.resolve(),
            out_dir=tmp_path / "export",
            formats=("torchscript",),  # what --method trace makes (the family has the rest)
            method="trace",
            allow_unsafe_trace=True,
        )
    )
    ts = result.manifest.to_json()["artifacts"]["torchscript"]
    assert ts["method"] == "trace"
    assert ts["reason"].startswith("UNSAFE trace kept by --allow-unsafe-trace")
    report = verify(
        VerifyConfig(model="my_rnn_loop", export_dir=result.out_dir, report=tmp_path / "p.json")
    )
    assert not report.passed
    # Said whether or not it passes: a user's own model's random probes all took one
    # branch, and verify passed the UNSAFE trace without a word.
    assert any(n.startswith("torchscript is an UNSAFE trace") for n in report.notes)
    failed = {(r.backend, r.inputs) for r in report.failures}
    assert ("torchscript", "probe alternating seq=13 b=2") in failed
    assert "torchscript / probe" in report.failure_message()


def test_plain_trace_of_the_trained_cell_is_wrong_on_the_other_branch(
    family: dict[str, ExportResult],
) -> None:
    from pipeline.zoo import get_entry

    entry = get_entry("my_cell")
    model = entry.build()
    ckpt = family["my_cell"].out_dir / family["my_cell"].manifest.checkpoint.path
    model.load_state_dict(torch.load(ckpt, weights_only=True))
    model.eval()
    probes = dict(entry.probe_inputs(torch.Generator().manual_seed(0), model))
    pos, neg = probes["gate+ b=3"], probes["gate- b=3"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, tuple(pos.values()))
    assert not torch.allclose(traced(*neg.values())[0], model(*neg.values())[0])
    scripted = torch.jit.load(str(family["my_cell"].out_dir / "model.torchscript.pt"))
    torch.testing.assert_close(scripted(*neg.values())[0], model(*neg.values())[0])
