"""Where the KServe and Ray workers run a model (serving.loading's `device`), on any machine.

"auto" (KServe's default) takes a GPU where there is one: torch's for TorchScript and
`.pt2`, ONNX Runtime's CUDA provider for ONNX, still without torch. Asking for CUDA where
there is none is refused by name, before a server starts. A Ray replica runs on the GPU
Ray reserved for it (--ray-replica-gpus), else on CPU. On a GPU machine the same loads run
on cuda:0 (tests/integration/test_gpu.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from pipeline.core.errors import ArtifactError, PipelineError
from pipeline.export import ExportResult
from pipeline.serving import loading
from pipeline.serving.launcher import free_port
from tests.conftest import run_cli, written_or_skip

ORT_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
TORCH_CUDA = torch.cuda.is_available()


def _golden(export_dir: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    golden = torch.load(export_dir / "golden.pt", weights_only=True)
    return {k: v.numpy() for k, v in golden["inputs"].items()}, golden["outputs"]["logits"].numpy()


@pytest.mark.parametrize(
    ("fmt", "where"),
    [
        ("onnx", "cuda:0" if ORT_CUDA else "cpu"),
        ("torchscript", "cuda:0" if TORCH_CUDA else "cpu"),
        ("pt2", "cpu"),  # compiled for CPU: it runs there wherever it is loaded
    ],
)
def test_auto_takes_the_gpu_where_there_is_one(
    exported: ExportResult, fmt: str, where: str
) -> None:
    written_or_skip(exported, fmt)
    loaded = loading.load(exported.out_dir, fmt, 1)
    assert loaded.device == where
    assert loaded.torch_free == (fmt == "onnx")
    inputs, logits = _golden(exported.out_dir)
    np.testing.assert_allclose(loaded.forward(inputs)[0], logits, atol=1e-4, rtol=1e-3)
    assert loading.load(exported.out_dir, fmt, 1, device="cpu").device == "cpu"


@pytest.mark.skipif(TORCH_CUDA or ORT_CUDA, reason="needs a machine without CUDA")
def test_cuda_asked_for_where_there_is_none_is_refused_by_name(exported: ExportResult) -> None:
    with pytest.raises(
        ArtifactError, match="has no CUDAExecutionProvider; install onnxruntime-gpu"
    ):
        loading.load(exported.out_dir, "onnx", 1, device="cuda")
    with pytest.raises(PipelineError, match="CUDA is not available on this machine"):
        loading.load(exported.out_dir, "torchscript", 1, device="cuda:0")
    with pytest.raises(ArtifactError, match="Unknown device 'gpu': use auto, cpu, cuda or cuda:N"):
        loading.load(exported.out_dir, "onnx", 1, device="gpu")


@pytest.mark.skipif(TORCH_CUDA, reason="needs a machine without CUDA")
def test_kserve_serve_refuses_cuda_before_starting(exported: ExportResult, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for device, said in [
        ("cuda", "Device 'cuda' was asked for but CUDA is not available"),
        ("gpu", "Unknown device 'gpu'"),
    ]:
        proc = run_cli(
            "serve", "--runtime", "kserve", "--export-dir", exported.out_dir,
            "--device", device, "--run-dir", run_dir, "--port", free_port(), cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode != 0
        assert said in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (run_dir / "server.json").exists()


def test_a_ray_replica_runs_where_ray_reserved_it_a_gpu(exported: ExportResult) -> None:
    """The deployment's own options and arguments, from build(), as Serve places it."""
    app = pytest.importorskip("pipeline.runtimes.ray.app")
    model = {"name": "digits_lenet", "export_dir": str(exported.out_dir), "format": "onnx",
             "version": None, "platform": "onnxruntime_onnx"}  # fmt: skip
    config = {"models": [model], "replica_cpus": 1, "replicas": 1, "autoscaling": {},
              "threads": 1, "max_batch_size": 8, "batch_wait_ms": 0.0}  # fmt: skip
    for gpus in (0.0, 0.5):
        built = app.build({**config, "replica_gpus": gpus}, None)
        deployment = built._bound_deployment.init_kwargs["digits_lenet"]._bound_deployment
        assert deployment.ray_actor_options.get("num_gpus", 0) == gpus
        if gpus and not ORT_CUDA:
            with pytest.raises(ArtifactError, match="no CUDAExecutionProvider"):
                app.Model.func_or_class(*deployment.init_args)
        else:
            replica = app.Model.func_or_class(*deployment.init_args)
            assert replica.device == ("cuda:0" if gpus else "cpu")


@pytest.mark.skipif(TORCH_CUDA, reason="needs a machine without CUDA")
def test_ray_replica_gpus_without_gpus_is_refused_before_starting(
    exported: ExportResult, tmp_path: Path
) -> None:
    """The local cluster has this machine's GPUs: none, so no replica could be placed and
    Serve would wait for one without end. (A joined cluster: test_ray_runtime.py.)"""
    proc = run_cli(
        "serve", "--runtime", "ray", "--ray-export-dir", exported.out_dir,
        "--ray-replica-gpus", "1", "--run-dir", tmp_path / "run", "--port", free_port(),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--ray-replica-gpus 1: the cluster has 0 GPU(s)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "server.json").exists()


@pytest.mark.skipif(TORCH_CUDA, reason="needs a machine without CUDA")
def test_verify_on_cuda_where_there_is_none_is_refused(
    exported: ExportResult, tmp_path: Path
) -> None:
    proc = run_cli(
        "verify", "--export-dir", exported.out_dir, "--device", "cuda",
        "--report", tmp_path / "p.json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Device 'cuda' was asked for but CUDA is not available" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "p.json").exists()


def test_verify_runs_the_c_clients_packages_where_they_were_compiled(
    exported: ExportResult,
) -> None:
    """`verify --device cuda --with-cpp`: the C++ client takes TorchScript to the GPU, but a
    .pt2 compiled for CPU stays there (the client refuses another device). Placement only:
    nothing runs (a GPU runs it in test_gpu.py)."""
    from pipeline.export.opened import open_export
    from pipeline.formats import base as registry
    from pipeline.verify.backends import CppBackend

    written_or_skip(exported, "pt2")
    opened = open_export(exported.out_dir)
    placed = {
        key: CppBackend(opened, registry.get(key), Path("run_torchscript"), "cuda:0").device
        for key in ("torchscript", "pt2")
    }
    assert placed == {"torchscript": "cuda:0", "pt2": "cpu"}
