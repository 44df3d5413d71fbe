"""Issue 42: the pipeline when torch refuses `torch.jit` (PyTorch PR #189705), simulated in
every process the test starts by tests/jit_refused/sitecustomize.py on PYTHONPATH.

One chain, as a user runs it: export with the defaults (exit 0, ONNX and .pt2, the
refusal said once), naming TorchScript fails saying why and what to do, verify with the
C++ client on the .pt2, then serve on each runtime with its default choice and check
the served answers against eager. The simulation's marks prove it reached the CLI and
TorchServe's Python worker.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.serving.launcher import free_port
from pipeline.train import TrainResult
from tests.conftest import run_cli

SIMULATION = Path(__file__).parents[1] / "jit_refused"


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    marks = tmp_path_factory.mktemp("jit_marks")
    return {"PYTHONPATH": str(SIMULATION), "JIT_REFUSED_MARKS": str(marks)}


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_export_verify_serve_without_torchscript(
    binary: Path, trained: TrainResult, refused: dict[str, str], tmp_path: Path
) -> None:
    export_dir = tmp_path / "export"
    ckpt = trained.checkpoint.path
    said = _ok(run_cli("export", "--checkpoint", ckpt, "--out-dir", export_dir, env=refused))
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert set(manifest["artifacts"]) >= {"onnx", "pt2"}, manifest["artifacts"]
    assert "torchscript" not in manifest["artifacts"]
    assert not manifest.get("failed"), manifest.get("failed")  # left out, not failed
    assert said.count("This torch refuses torch.jit") == 1, said
    assert "TorchScript is left out" in said and "I promise to migrate by 2.15" in said

    # Named on its own, TorchScript is tried and fails, saying why and what to do.
    named = run_cli(
        "export", "--checkpoint", ckpt, "--out-dir", tmp_path / "ts", "--format", "torchscript",
        env=refused,
    )  # fmt: skip
    assert named.returncode == 1 and "Traceback" not in named.stderr, named.stderr
    assert "TorchScript cannot be written: this torch refuses torch.jit" in named.stderr
    assert "torch==2.14.1" in named.stderr

    cpp = _ok(run_cli("verify", "--export-dir", export_dir, "--with-cpp",
                      "--cpp-build-dir", binary.parent, "--report", tmp_path / "parity.json",
                      env=refused))  # fmt: skip
    assert "cpp/pt2" in cpp and "PASS" in cpp, cpp

    for runtime in ("kserve", "torchserve"):
        run_dir = tmp_path / f"run-{runtime}"
        if runtime == "kserve":
            where = ["--export-dir", export_dir, "--grpc-port", free_port()]
        else:
            store = tmp_path / "store"
            _ok(run_cli("archive", "--export-dir", export_dir, "--store", store, env=refused))
            where = ["--store", store, "--management-port", free_port(),
                     "--metrics-port", free_port()]  # fmt: skip
        started = _ok(run_cli("serve", "--runtime", runtime, "--port", free_port(),
                              "--run-dir", run_dir, *where, env=refused))  # fmt: skip
        try:
            served = json.loads((run_dir / "server.json").read_text())["served"]
            assert [a["format"] for a in served.values()] == ["onnx"], started
            _ok(run_cli("verify", "--export-dir", export_dir, "--backend", runtime,
                        "--run-dir", run_dir, "--report", tmp_path / f"{runtime}.json",
                        env=refused))  # fmt: skip
        finally:
            run_cli("stop", "--run-dir", run_dir)

    # deploy kserve without --format deploys what serve served (ONNX), not TorchScript,
    # which this export does not hold.
    deployed = _ok(run_cli("deploy", "kserve", "--model", "digits_lenet", "--export-dir",
                           export_dir, "--out", tmp_path / "deploy", env=refused))  # fmt: skip
    assert "deploying digits_lenet as onnx" in deployed, deployed
    (model,) = json.loads((tmp_path / "deploy" / "kserve.json").read_text())["models"]
    assert model["format"] == "onnx", model

    # The CLI and TorchServe's worker ran under the refusal; the KServe worker serving ONNX
    # never imports torch (issue 40's lean worker), so there was nothing to refuse there.
    reached = {p.name.split("-", 1)[1] for p in Path(refused["JIT_REFUSED_MARKS"]).iterdir()}
    assert {"__main__.py", "model_service_worker.py"} <= reached, reached
