"""Users' own models (module:Class, file.py:Class) and torchvision classifiers."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.core.errors import CheckpointError, InputSpecError, PipelineError, UnknownModelError
from pipeline.core.paths import model_slug
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.train import TrainConfig, train
from pipeline.verify import VerifyConfig, verify
from pipeline.zoo.user import load_spec_file, parse_input
from tests.conftest import run_cli

USER_FILE = Path(__file__).parent / "data" / "user_gated.py"


cli = run_cli


def test_file_model_exports_and_verifies_from_the_command_line(tmp_path: Path) -> None:
    """A class in a file outside the package, with kwargs, two inputs and a gate."""
    model = f"{USER_FILE}:TinyGated"
    art = tmp_path / "art"
    proc = cli("--artifacts-dir", art, "export", "--model", model, "--random-init", cwd=tmp_path)
    # No inputs and no export to take them from: bad arguments (2), as --help says.
    assert proc.returncode == 2 and "inputs must be given: --input" in proc.stderr, proc.stderr
    proc = cli(
        "--artifacts-dir", art, "export", "--model", model, "--model-kwargs", '{"width": 16}',
        "--input", "x:float32:batch,6", "--input", "scale:float32:1", "--output", "scores",
        "--random-init", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "script: trace rejected: TracerWarning at" in proc.stdout
    assert "user_gated.py:13" in proc.stdout
    proc = cli("--artifacts-dir", art, "verify", "--model", model, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout
    manifest = art / "user_gated_TinyGated" / "export" / "manifest.json"
    # Exported again with --model alone, as verify: the inputs and output names recorded.
    proc = cli("--artifacts-dir", art, "export", "--model", model, "--format", "onnx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (
        "records them: --input x:float32:batch,6 --input scale:float32:1 "
        """--model-kwargs '{"width": 16}' --output scores (give --input"""
    ) in proc.stderr
    recorded = json.loads(manifest.read_text())
    assert [(i["name"], i["shape"]) for i in recorded["inputs"]] == [
        ("x", ["batch", 6]), ("scale", [1])
    ]  # fmt: skip
    assert [o["name"] for o in recorded["outputs"]] == ["scores"]


def test_module_model_with_spec_file_weights_and_probes(tmp_path: Path) -> None:
    """package.module:Class from PYTHONPATH, inputs from YAML, a user's state_dict and probes."""
    sys.path.insert(0, str(USER_FILE.parent))
    try:
        import user_gated

        torch.manual_seed(3)
        net = user_gated.TinyGated(width=8)
        torch.save(net.state_dict(), tmp_path / "weights.pt")
        (tmp_path / "spec.yaml").write_text(
            "inputs:\n"
            "  - {name: x, dtype: float32, shape: [batch, 6], low: 0, high: 4}\n"
            "  - {name: scale, dtype: float32, shape: [1]}\n"
            "outputs: [scores]\n"
        )
        # Probes on both sides of the gate (h.mean() > 0.5): big and zero inputs.
        probes = {
            "gate on": {"x": torch.full((2, 6), 5.0), "scale": torch.tensor([3.0])},
            "gate off": {"x": torch.zeros(1, 6), "scale": torch.tensor([3.0])},
        }
        torch.save(probes, tmp_path / "probes.pt")
        inputs, outputs = load_spec_file(tmp_path / "spec.yaml")
        result = export(
            ExportConfig(
                model="user_gated:TinyGated",
                inputs=inputs,
                outputs=outputs,
                probes_file=tmp_path / "probes.pt",
                weights=tmp_path / "weights.pt",
                checkpoint=tmp_path / "art" / "checkpoint.pt",
                out_dir=tmp_path / "art" / "export",
            )
        )
        m = result.manifest.to_json()
        assert m["model"]["source"] == "user"
        assert m["model"]["init"] == "imported"
        assert m["outputs"][0]["name"] == "scores"
        assert m["artifacts"]["torchscript"]["method"] == "script"
        report = verify(
            VerifyConfig(
                model="user_gated:TinyGated", export_dir=result.out_dir, report=tmp_path / "p.json"
            )
        )
        assert report.passed, report.failure_message()
        assert {"probe gate on", "probe gate off"} <= {r.inputs for r in report.rows}
    finally:
        sys.path.remove(str(USER_FILE.parent))


def test_torchvision_resnet18_exports_and_verifies(
    resnet18_cli: dict[str, Any], tmp_path: Path
) -> None:
    # The export is the session's (`pipeline export --model torchvision:resnet18
    # --random-init`, run once: test_cpp_client times its TorchScript file too); verify
    # runs on a copy, so the report it writes beside the export is this test's own.
    assert resnet18_cli["returncode"] == 0, resnet18_cli["stderr"]
    assert "trace: traced" in resnet18_cli["stdout"]
    art = tmp_path / "art"
    shutil.copytree(resnet18_cli["art"], art)
    proc = cli(
        "--artifacts-dir",
        art,
        "verify",
        "--model",
        "torchvision:resnet18",
        "--batch-sizes",
        "2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "onnxruntime" in proc.stdout
    assert (art / "torchvision_resnet18" / "parity.json").is_file()


def test_slugs() -> None:
    assert model_slug("torchvision:resnet18") == "torchvision_resnet18"
    assert model_slug("a/b/net.py:Net") == "net_Net"
    assert model_slug("pkg.mod:Net") == "pkg.mod_Net"
    assert model_slug("digits_lenet") == "digits_lenet"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x:float32", "expected NAME:DTYPE:SHAPE"),
        ("x:float99:batch,3", "Unknown dtype 'float99'"),
        ("x:float32:batch,0", "must be at least 1"),
        ("1x:float32:3", "must be a Python identifier"),
        ("x:float32:batch,3-4", "must be an identifier"),
    ],
)
def test_bad_input_specs(text: str, message: str) -> None:
    with pytest.raises(InputSpecError, match=message):
        parse_input(text)


def test_input_spec_parses_dynamic_axes() -> None:
    spec = parse_input("image:float32:batch,3,32,32")
    assert spec.shape == ("batch", 3, 32, 32)
    assert spec.dynamic_axes() == {0: "batch"}


def test_user_model_errors(tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match="inputs must be given"):
        export(
            ExportConfig(model=f"{USER_FILE}:TinyGated", random_init=True, out_dir=tmp_path / "e")
        )
    with pytest.raises(UnknownModelError, match=r"has no torch\.nn\.Module subclass named .Nope."):
        export(ExportConfig(model=f"{USER_FILE}:Nope", random_init=True, out_dir=tmp_path / "e"))
    with pytest.raises(UnknownModelError, match="does not exist"):
        export(
            ExportConfig(
                model=f"{tmp_path}/missing.py:Net", random_init=True, out_dir=tmp_path / "e"
            )
        )
    with pytest.raises(UnknownModelError, match="Cannot import module 'no_such_pkg'"):
        export(ExportConfig(model="no_such_pkg:Net", random_init=True, out_dir=tmp_path / "e"))
    with pytest.raises(
        UnknownModelError,
        match=r"Unknown torchvision model 'resnet9'. Known classifiers: .*detectors: ",
    ):
        export(ExportConfig(model="torchvision:resnet9", random_init=True, out_dir=tmp_path / "e"))
    with pytest.raises(CheckpointError, match=r"--weights FILE .* or --random-init"):
        export(
            ExportConfig(
                model="torchvision:resnet18",
                checkpoint=tmp_path / "none.pt",
                out_dir=tmp_path / "e",
            )
        )
    with pytest.raises(PipelineError, match="not a zoo model"):
        train(TrainConfig(model="torchvision:resnet18", out=tmp_path / "c.pt"))
    assert not (tmp_path / "e").exists()


def _export(tmp_path: Path, model: str, *inputs: str, **kw: object) -> ExportResult:
    return export(
        ExportConfig(
            model=model,
            inputs=[parse_input(i) for i in inputs],
            random_init=True,
            checkpoint=tmp_path / "ckpt" / "checkpoint.pt",
            out_dir=tmp_path / "export",
            **kw,
        )
    )


def test_sequence_axis_of_a_user_model_stays_dynamic(tmp_path: Path) -> None:
    """A trace would unroll the loop for one length: probes vary every named axis."""
    import onnx

    result = _export(tmp_path, f"{USER_FILE}:SeqLoop", "xs:float32:seq,batch,4")
    assert result.manifest.to_json()["artifacts"]["torchscript"]["method"] == "script"
    graph = onnx.load(str(result.out_dir / "model.onnx")).graph
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["seq", "batch", 4]
    report = verify(
        VerifyConfig(
            model=f"{USER_FILE}:SeqLoop", export_dir=result.out_dir, report=tmp_path / "p.json"
        )
    )
    assert report.passed, report.failure_message()
    assert any("seq=" in r.inputs for r in report.rows)


def test_model_no_method_can_compile_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="No faithful TorchScript"):
        _export(tmp_path, f"{USER_FILE}:Unsplittable", "x:float32:batch,4")


def test_integer_inputs_default_to_valid_indices(tmp_path: Path) -> None:
    spec = parse_input("tokens:int64:batch,5")
    # high is exclusive (torch.randint's rule): 0:10 draws the ten indices 0..9
    assert (spec.low, spec.high) == (0.0, 10.0)
    result = _export(tmp_path, f"{USER_FILE}:Embedder", "tokens:int64:batch,seq:0:9")
    report = verify(
        VerifyConfig(
            model=f"{USER_FILE}:Embedder", export_dir=result.out_dir, report=tmp_path / "p.json"
        )
    )
    assert report.passed, report.failure_message()


def test_failed_import_of_weights_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    model = f"{USER_FILE}:TinyGated"
    inputs = ("x:float32:batch,6", "scale:float32:1")
    first = _export(tmp_path, model, *inputs)
    before = (tmp_path / "ckpt" / "checkpoint.pt").read_bytes()
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "wrong.pt")
    with pytest.raises(
        CheckpointError, match=r"The state_dict in .*wrong\.pt \(--weights\) does not fit"
    ) as err:
        export(
            ExportConfig(
                model=model,
                inputs=[parse_input(i) for i in inputs],
                weights=tmp_path / "wrong.pt",
                checkpoint=tmp_path / "ckpt" / "checkpoint.pt",
                out_dir=tmp_path / "export",
            )
        )
    assert "--weights and --model-kwargs belong to this class" in str(err.value)
    assert (tmp_path / "ckpt" / "checkpoint.pt").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checkpoint.json",
        "checkpoint.pt",
    ]
    assert verify(
        VerifyConfig(model=model, export_dir=first.out_dir, report=tmp_path / "p.json")
    ).passed


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("class Broken(:\n", r"line 1\).*SyntaxError"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ],
)
def test_user_file_that_fails_to_import(tmp_path: Path, source: str, message: str) -> None:
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(UnknownModelError, match=message):
        _export(tmp_path, f"{path}:Broken", "x:float32:batch,4")


def test_more_user_errors_are_clear(tmp_path: Path) -> None:
    model = f"{USER_FILE}:TinyGated"
    with pytest.raises(
        InputSpecError, match=r"Cannot construct .* unexpected keyword argument 'nope'"
    ):
        _export(tmp_path, model, "x:float32:batch,6", "scale:float32:1", model_kwargs={"nope": 1})
    with pytest.raises(PipelineError, match=r"failed on inputs built from its input spec"):
        _export(tmp_path, model, "x:float32:batch,5", "scale:float32:1")
    with pytest.raises(InputSpecError, match="more than once"):
        _export(tmp_path, model, "x:float32:batch,6", "x:float32:1")
    with pytest.raises(PipelineError, match="finite and non-negative"):
        _export(tmp_path, model, "x:float32:batch,6", "scale:float32:1", atol=float("nan"))
    with pytest.raises(InputSpecError, match="fixed constructor arguments"):
        export(ExportConfig(model="digits_lenet", model_kwargs={"dropout": 0.9}))
    bad_spec = tmp_path / "spec.yaml"
    bad_spec.write_text("inputs:\n  - {name: x, shape: 3, low: abc}\n")
    with pytest.raises(InputSpecError, match="'shape' must be a list"):
        load_spec_file(bad_spec)
    torch.save(3, tmp_path / "probes.pt")
    from pipeline.zoo.user import load_probes

    with pytest.raises(InputSpecError, match="holds a int"):
        load_probes(tmp_path / "probes.pt")


def test_inputs_out_of_forward_s_order_and_renamed_dict_outputs_are_refused(
    tmp_path: Path,
) -> None:
    """Both exported with exit 0 and verified, and computed something else by name: `--input
    scale --input x` for forward(self, x, scale) fed x the tensor named scale (ONNX's
    input `scale` was forward's x), and `--output embedding --output logits` for a dict
    {"logits", "embedding"} swapped the two outputs."""
    model = f"{USER_FILE}:TinyGated"
    with pytest.raises(InputSpecError, match=r"'scale' is given in place 1, but forward\(\) "
                       r"takes 'scale' in place 2.*forward\(\)'s order \(x, scale\)"):  # fmt: skip
        _export(tmp_path, model, "scale:float32:1", "x:float32:batch,6")
    # Names that are not forward()'s bind by position, as documented.
    assert _export(tmp_path, model, "features:float32:batch,6", "s:float32:1").manifest
    with pytest.raises(PipelineError, match=r"returns a dict with keys logits, embedding, but "
                       r"its outputs are named embedding, logits"):  # fmt: skip
        _export(tmp_path, f"{USER_FILE}:DictHeads", "x:float32:batch,4",
                outputs=["embedding", "logits"])  # fmt: skip


def test_integer_range_high_is_exclusive_everywhere(tmp_path: Path) -> None:
    """`ids:int64:batch,seq:0:50` for a 50-word vocabulary: export and verify never draw 50."""
    spec = parse_input("ids:int64:batch,seq:0:50")
    drawn = spec.sample({"batch": 64, "seq": 64}, torch.Generator().manual_seed(0))
    assert int(drawn.min()) >= 0 and int(drawn.max()) == 49
    with pytest.raises(InputSpecError, match="empty"):
        parse_input("ids:int64:batch:3:3")
    result = _export(tmp_path, f"{USER_FILE}:Vocab50", "ids:int64:batch,seq:0:50")
    report = verify(
        VerifyConfig(
            model=f"{USER_FILE}:Vocab50", export_dir=result.out_dir, report=tmp_path / "p.json"
        )
    )
    assert report.passed, report.failure_message()


def test_dict_outputs_keep_their_names(tmp_path: Path, binary: Path) -> None:
    """A model returning a dict: manifest, ONNX graph, every backend's rows, the C++ client."""
    import onnx

    result = _export(tmp_path, f"{USER_FILE}:DictHeads", "x:float32:batch,4")
    assert result.manifest.output_names == ["logits", "embedding"]
    graph = onnx.load(str(result.out_dir / "model.onnx")).graph
    assert [o.name for o in graph.output] == ["logits", "embedding"]
    golden = torch.load(result.out_dir / "golden.pt", weights_only=True)
    assert list(golden["outputs"]) == ["logits", "embedding"]
    report = verify(
        VerifyConfig(
            model=f"{USER_FILE}:DictHeads",
            export_dir=result.out_dir,
            backends=("torchscript", "onnxruntime", "cpp"),
            cpp_binary=binary,
            report=tmp_path / "p.json",
        )
    )
    assert report.passed, report.failure_message()
    assert {(r.backend, r.output) for r in report.rows} >= {
        (b, o) for b in ("torchscript", "onnxruntime", "cpp") for o in ("logits", "embedding")
    }


NET = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)
"""


def test_two_files_of_one_name_do_not_share_an_export(tmp_path: Path) -> None:
    """`a/net.py:Net` then `b/net.py:Net` (both `net_Net`): the second export replaced the
    first's export and checkpoint without a word. And verify of the first by its absolute
    path was refused as another model."""
    art = tmp_path / "art"
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "net.py").write_text(NET)
    common = ("--artifacts-dir", art, "export", "--model", "net.py:Net", "--input",
              "x:float32:batch,4", "--random-init", "--format", "torchscript")  # fmt: skip
    assert cli(*common, cwd=tmp_path / "a").returncode == 0
    before = (art / "net_Net" / "export" / "manifest.json").read_bytes()
    proc = cli(*common, cwd=tmp_path / "b")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"holds the export of {tmp_path / 'a' / 'net.py'} (net.py:Net), another file" in (
        proc.stderr
    )
    assert (art / "net_Net" / "export" / "manifest.json").read_bytes() == before
    proc = cli("--artifacts-dir", art, "verify", "--model", f"{tmp_path / 'a' / 'net.py'}:Net",
               "--export-dir", art / "net_Net" / "export", "--backend", "torchscript",
               cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
