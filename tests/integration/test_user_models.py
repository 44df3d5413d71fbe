"""Users' own models (module:Class, file.py:Class) and torchvision classifiers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.errors import CheckpointError, InputSpecError, PipelineError, UnknownModelError
from pipeline.export import ExportConfig, export
from pipeline.train import TrainConfig, train
from pipeline.verify import VerifyConfig, verify
from pipeline.zoo.user import load_spec_file, model_slug, parse_input

USER_FILE = Path(__file__).parent / "data" / "user_gated.py"


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_file_model_exports_and_verifies_from_the_command_line(tmp_path: Path) -> None:
    """A class in a file outside the package, with kwargs, two inputs and a gate."""
    model = f"{USER_FILE}:TinyGated"
    art = tmp_path / "art"
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
    assert (art / "user_gated_TinyGated" / "export" / "manifest.json").is_file()


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
        m = result.manifest
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


def test_torchvision_resnet18_exports_and_verifies(tmp_path: Path) -> None:
    art = tmp_path / "art"
    proc = cli(
        "--artifacts-dir",
        art,
        "export",
        "--model",
        "torchvision:resnet18",
        "--random-init",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "trace: traced" in proc.stdout
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
    with pytest.raises(UnknownModelError, match="Unknown torchvision classifier 'resnet9'"):
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
