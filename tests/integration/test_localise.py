"""Localising a parity failure: the first PyTorch module whose output departs from eager's.

Each test alters one layer of a real export behind the manifest's back (and
re-seals the manifest's sha256, so only the numbers can catch it), then
checks that `localise` names that layer.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from pipeline.core.errors import ArtifactError
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.export.opened import open_export
from pipeline.verify.localise import Localisation, localise
from pipeline.zoo.user import parse_input
from tests.tamper import alter_onnx_initializer, alter_torchscript_parameter, copy_export, reseal

USER_FILE = Path(__file__).parent / "data" / "user_gated.py"


def _export(root: Path, model: str, formats: tuple[str, ...], **kw: object) -> ExportResult:
    return export(
        ExportConfig(
            model=model,
            random_init=True,
            checkpoint=root / "checkpoint.pt",
            out_dir=root / "export",
            formats=formats,
            **kw,  # type: ignore[arg-type]
        )
    )


def _alter_onnx(export_dir: Path, initializer: str) -> None:
    alter_onnx_initializer(export_dir, initializer, lambda w: w + np.float32(0.5))


def _localise(export_dir: Path, key: str, bisect_dir: Path | None = None) -> Localisation:
    exported = open_export(export_dir)
    inputs, _ = exported.golden()
    tol = exported.manifest.tolerance
    return localise(exported, key, inputs, tol.atol, tol.rtol, bisect_dir=bisect_dir)


@pytest.mark.parametrize(
    ("which", "key"), [("mobilenet", "onnx"), ("exported", "onnx"), ("exported", "torchscript")]
)
def test_an_unaltered_export_localises_nothing(
    which: str, key: str, request: pytest.FixtureRequest
) -> None:
    result: ExportResult = request.getfixturevalue(which)
    found = _localise(result.out_dir, key)
    assert found.available, found.note
    assert found.divergence is None, found.describe()
    assert found.compared >= (100 if which == "mobilenet" else 10)
    assert "no intermediate value departs" in found.describe()


def test_an_altered_onnx_layer_is_named_by_module_path_and_class(
    mobilenet: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(mobilenet, tmp_path / "export")
    # The squeeze-excitation's second conv: no BatchNorm is fused into it.
    _alter_onnx(export_dir, "features.1.block.1.fc2.weight")
    found = _localise(export_dir, "onnx")
    div = found.divergence
    assert div is not None, found.describe()
    assert (div.module, div.op) == ("features.1.block.1.fc2", "Conv2d")
    assert div.describe().startswith("features.1.block.1.fc2 (Conv2d): max abs err ")
    assert "ONNX value" in div.describe()
    assert found.describe().startswith("onnxruntime: first departs at features.1.block.1.fc2")
    assert json.loads(json.dumps(found.to_json()))["divergence"]["module"] == div.module


def test_a_conv_fused_with_its_batchnorm_is_named_with_both(
    mobilenet: ExportResult, tmp_path: Path
) -> None:
    """The exporter folds BatchNorm into the Conv before it: the graph has no value for
    the Conv alone, so the departure shows at the BatchNorm, naming the Conv too."""
    export_dir = copy_export(mobilenet, tmp_path / "export")
    _alter_onnx(export_dir, "features.3.block.0.0.weight")
    div = _localise(export_dir, "onnx").divergence
    assert div is not None
    assert (div.module, div.op) == ("features.3.block.0.1", "BatchNorm2d")
    assert "features.3.block.0.0 (Conv2d)" in div.detail


def test_bisect_writes_a_subgraph_that_departs_on_its_own(
    mobilenet: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(mobilenet, tmp_path / "export")
    _alter_onnx(export_dir, "features.1.block.1.fc2.weight")
    found = _localise(export_dir, "onnx", bisect_dir=tmp_path / "bisect")
    assert found.subgraph is not None, found.note
    assert found.subgraph.parent == tmp_path / "bisect"
    sub = onnx.load(str(found.subgraph))
    onnx.checker.check_model(sub)
    assert [n.op_type for n in sub.graph.node] == ["Conv"]  # the altered node alone
    assert "features.1.block.1.fc2.weight" in {t.name for t in sub.graph.initializer}
    # Run it ourselves on the values written beside it: it departs from eager's output.
    values = np.load(found.subgraph.with_suffix(".npz"))
    session = ort.InferenceSession(str(found.subgraph), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: values[i.name] for i in session.get_inputs()})[0]
    expected = values[sub.graph.output[0].name]
    tol = open_export(export_dir).manifest.tolerance
    assert not np.allclose(got, expected, rtol=tol.rtol, atol=tol.atol)


def test_an_altered_torchscript_parameter_is_localised_to_its_submodule(
    exported: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(exported, tmp_path / "export")
    alter_torchscript_parameter(export_dir, "features.4.weight")  # the digits CNN's second conv
    found = _localise(export_dir, "torchscript")
    div = found.divergence
    assert div is not None, found.describe()
    assert (div.module, div.op) == ("features.4", "Conv2d")
    assert div.kind == "TorchScript submodule"
    assert found.describe().startswith("torchscript: first departs at features.4 (Conv2d)")
    # The ONNX artifact was not touched.
    assert _localise(export_dir, "onnx").divergence is None


def test_a_frozen_torchscript_module_cannot_be_localised(
    exported: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(exported, tmp_path / "export")
    path = export_dir / "model.torchscript.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        frozen = torch.jit.freeze(torch.jit.load(str(path)).eval())  # inlines every submodule
        torch.jit.save(frozen, str(path))
    reseal(export_dir, "torchscript")
    found = _localise(export_dir, "torchscript")
    assert not found.available
    assert found.divergence is None
    assert "frozen" in found.note and found.describe().startswith("torchscript: cannot localise")


def test_the_torchscript_based_onnx_exporter_is_localised_by_node_scopes(tmp_path: Path) -> None:
    """A model with a data-dependent `if` and no torch.cond formulation: its ONNX comes
    from the legacy exporter, whose nodes are named after scopes (`/fc/Gemm`)."""
    result = _export(
        tmp_path,
        f"{USER_FILE}:TinyGated",
        ("onnx",),
        inputs=[parse_input("x:float32:batch,6"), parse_input("scale:float32:1")],
        outputs=["scores"],
    )
    assert result.manifest.artifacts["onnx"].how.startswith("torchscript")
    _alter_onnx(result.out_dir, "fc.weight")
    div = _localise(result.out_dir, "onnx").divergence
    assert div is not None
    assert (div.module, div.op) == ("fc", "Linear")
    assert div.value.startswith("/fc/")


def test_a_loop_exported_as_scan_is_localised_to_the_loop(tmp_path: Path) -> None:
    """The cell runs inside an ONNX Scan, whose body has no values ORT can output: the
    departure shows at the loop module; its subgraph (the Scan) departs on its own."""
    result = _export(tmp_path, "wrap_rnn", ("onnx",))
    _alter_onnx(result.out_dir, "loop.cell.linear.weight")
    found = _localise(result.out_dir, "onnx", bisect_dir=tmp_path / "bisect")
    assert found.divergence is not None, found.describe()
    assert (found.divergence.module, found.divergence.op) == ("loop", "MyRNNLoop")
    assert found.subgraph is not None, found.note
    assert "Scan" in {n.op_type for n in onnx.load(str(found.subgraph)).graph.node}


def test_pt2_keeps_no_intermediates(exported: ExportResult) -> None:
    found = _localise(exported.out_dir, "pt2")
    assert not found.available and found.divergence is None and found.compared == 0
    assert "AOTInductor" in found.note and "ONNX or TorchScript" in found.note
    assert found.to_json()["available"] is False


def test_an_artifact_the_export_lacks_is_refused(mobilenet: ExportResult) -> None:
    with pytest.raises(ArtifactError, match="no 'pt2' artifact"):
        _localise(mobilenet.out_dir, "pt2")
