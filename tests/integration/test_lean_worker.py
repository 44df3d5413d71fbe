"""Issue 40, point 4: the KServe runtime serves ONNX without importing torch, and
`pipeline deploy kserve` builds a torch-free image for it.

The runtime's own modules and an ONNX model's load, warm-up and forward pass run in a
fresh interpreter, which must end with no `torch` in sys.modules and answer what export
stored as eager's outputs. An export without `warmup.npz` (written before it existed)
still serves, through torch, and says how to get the lean path back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.manifest import read_manifest
from pipeline.export import ExportResult
from pipeline.runtimes.kserve.deploy import PROJECT_ROOT
from pipeline.runtimes.kserve.leanimage import (
    REQUIREMENTS_FILE,
    closure,
    requirements,
)
from pipeline.runtimes.kserve.leanimage import lean as image_is_lean
from pipeline_runtime.manifest import WARMUP_KEY
from tests.conftest import run_cli
from tests.tamper import _write, copy_export

SERVE_ONNX = """
import importlib.abc, importlib.metadata as md, json, re, sys, asyncio

# The image in miniature: a distribution outside the allowed ones (argv[3]) is missing.
allowed, owners = set(json.loads(sys.argv[3])), md.packages_distributions()

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        dists = owners.get(name.split(".")[0], [])
        if dists and not any(re.sub(r"[-_.]+", "-", d).lower() in allowed for d in dists):
            raise ModuleNotFoundError(f"No module named {name!r} (not in the image)")
        return None

if allowed:
    sys.meta_path.insert(0, Missing())
import numpy as np
import pipeline.runtimes.kserve.runtime  # the worker's whole import graph
from pipeline.runtimes.kserve.config import RuntimeConfig, ServedExport
from pipeline.runtimes.kserve.models import ExportModel

export_dir, inputs = sys.argv[1], json.loads(sys.argv[2])
model = ExportModel(ServedExport("m", export_dir, "onnx"), RuntimeConfig(models=[]))
arrays = {k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}
outputs = asyncio.run(model.run(arrays, False))
print(json.dumps({"outputs": [o.tolist() for o in outputs], "torch_free": model.torch_free,
                  "torch": "torch" in sys.modules}))
"""


def _serve_once(
    export_dir: Path, inputs: dict[str, torch.Tensor], allowed: set[str] | None = None
) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", SERVE_ONNX, str(export_dir),
         json.dumps({k: v.tolist() for k, v in inputs.items()}),
         json.dumps(sorted(allowed or ()))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def _golden(exported: ExportResult) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    data = torch.load(exported.out_dir / "golden.pt", weights_only=True)
    return dict(data["inputs"]), list(data["outputs"].values())


def test_the_onnx_serving_path_never_imports_torch(exported: ExportResult) -> None:
    """Loaded, warmed up and run with only the serve-onnx extra's distributions (and
    the project) importable, as in the torch-free image: no torch, eager's answers."""
    inputs, eager = _golden(exported)
    extra = closure(requirements(PROJECT_ROOT / "pyproject.toml"))
    assert "torch" not in extra
    answer, _ = _serve_once(exported.out_dir, inputs, extra | {"pipeline"})
    assert answer["torch"] is False and answer["torch_free"] is True
    tol = read_manifest(exported.out_dir).tolerance
    for got, want in zip(answer["outputs"], eager, strict=True):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=tol.rtol, atol=tol.atol)
    # The warm-up file holds exactly the golden inputs, as numpy arrays.
    with np.load(exported.out_dir / "warmup.npz", allow_pickle=False) as saved:
        assert sorted(saved.files) == sorted(inputs)
        for k, v in inputs.items():
            np.testing.assert_array_equal(saved[k], v.numpy())


def test_an_export_without_warmup_serves_through_torch(
    exported: ExportResult, tmp_path: Path
) -> None:
    old = copy_export(exported, tmp_path / "old")
    manifest = read_manifest(old)
    del manifest.artifacts[WARMUP_KEY]
    _write(old, manifest)
    (old / "warmup.npz").unlink()
    inputs, eager = _golden(exported)
    answer, stderr = _serve_once(old, inputs)
    assert answer["torch"] is True and answer["torch_free"] is False
    assert "re-export to serve it torch-free" in stderr
    np.testing.assert_allclose(np.asarray(answer["outputs"][0]), eager[0].numpy(), atol=1e-4)
    # ... so `deploy kserve` keeps torch in its image: the image is lean exactly when the
    # worker in it will load without torch (it was lean by the format alone, and its
    # worker then failed to import torch).
    assert image_is_lean("onnx", read_manifest(exported.out_dir)) is True
    assert image_is_lean("onnx", read_manifest(old)) is False


def test_deploy_of_onnx_builds_the_torch_free_image(exported: ExportResult, tmp_path: Path) -> None:
    """`pipeline deploy kserve --format onnx`: the Dockerfile installs the project without
    its dependencies, then the serve-onnx extra alone; the CLI prints both images' sizes."""
    proc = run_cli("deploy", "kserve", "--model", "digits_lenet", "--export-dir",
                   exported.out_dir, "--format", "onnx", "--out", tmp_path / "out")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    dockerfile = (tmp_path / "out" / "Dockerfile").read_text()
    assert "pip install --no-deps /opt/pipeline" in dockerfile and "TORCH_INDEX" not in dockerfile
    listed = (tmp_path / "out" / "src" / REQUIREMENTS_FILE).read_text().split()
    assert listed == requirements(PROJECT_ROOT / "pyproject.toml")
    assert "torch" not in closure(listed)
    sizes = re.search(r"torch-free ([\d,]+) MB .* against ([\d,]+) MB with torch", proc.stdout)
    assert sizes, proc.stdout
    lean_mb, full_mb = (float(g.replace(",", "")) for g in sizes.groups())
    assert 0 < lean_mb < full_mb


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_only_onnx_with_its_warmup_is_lean(exported: ExportResult, fmt: str) -> None:
    from pipeline.serving.loading import lean

    assert lean(fmt, read_manifest(exported.out_dir)) is (fmt == "onnx")
