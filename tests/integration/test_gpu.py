"""The GPU paths of the serving workers, without the servers: TorchServe's handler loaded as
its worker loads it when the frontend hands it a GPU id, the KServe and Ray workers'
loader on CUDA, and the C++ client on cuda:0 (TorchScript, an export's CUDA `.pt2`).

A GPU machine is lent for minutes, with its own torch and without Java (tests/README.md,
"On a GPU machine"): a real TorchServe on a GPU is tested in test_serving.py
(test_gpu_serving_*), where Java is. The other GPU tests: test_training_modes.py (AMP)
and test_cpp_pt2.py (a hand-compiled CUDA package of two inputs and two outputs). Every test here is
marked `gpu` and skips without CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.export import ExportConfig, ExportResult, export
from pipeline.formats import cpp
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.serving import loading
from pipeline.serving.wire import tensors_body
from pipeline.train import TrainResult
from tests import ts_worker
from tests.conftest import written_or_skip

pytestmark = pytest.mark.gpu

# What a GPU computes differs from the CPU in the last bits (other kernels, TF32 off).
ATOL, RTOL = 1e-4, 1e-3


def _golden(export_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    golden = torch.load(export_dir / "golden.pt", weights_only=True)
    return golden["inputs"]["image"], golden["outputs"]["logits"]


@pytest.fixture(scope="module")
def cuda_export(trained: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """The same checkpoint's `.pt2` compiled for CUDA (`--pt2-device cuda`)."""
    return export(
        ExportConfig(
            checkpoint=trained.checkpoint.path,
            out_dir=tmp_path_factory.mktemp("gpu") / "cuda_export",
            formats=("pt2",),
            pt2_device="cuda",
        )
    )


def test_cpp_client_runs_torchscript_on_cuda(binary: Path, exported: ExportResult) -> None:
    image, logits = _golden(exported.out_dir)
    model = exported.out_dir / "model.torchscript.pt"
    done = cpp.run(model, [[image]], binary=binary, device="cuda:0", repeat=5)
    assert done.stats["device"] == "cuda:0"
    torch.testing.assert_close(done.outputs[0][0], logits, atol=ATOL, rtol=RTOL)


def test_cpp_client_runs_an_exported_cuda_package(
    binary: Path, exported: ExportResult, cuda_export: ExportResult
) -> None:
    package = cuda_export.out_dir / "model.pt2"
    image, logits = _golden(cuda_export.out_dir)
    cases = [[image], [torch.rand(9, 1, 28, 28)]]
    done = cpp.run(package, cases, binary=binary, device="cuda:0", repeat=3)
    assert (done.stats["device"], done.stats["format"]) == ("cuda:0", "pt2")
    torch.testing.assert_close(done.outputs[0][0], logits, atol=ATOL, rtol=RTOL)
    eager = torch.jit.load(str(exported.out_dir / "model.torchscript.pt"))
    torch.testing.assert_close(done.outputs[1][0], eager(cases[1][0]), atol=ATOL, rtol=RTOL)


def _served(
    export_dir: Path, fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, np.ndarray]:
    """Archived for GPU workers and loaded as TorchServe's worker with GPU id 0 does; the
    handler and its answer to the golden inputs, as JSON."""
    (mar,) = archive(
        ArchiveConfig(
            model="digits_lenet",
            export_dir=export_dir,
            store=tmp_path / fmt / "store",
            formats=(fmt,),
            device="gpu",
        )
    )
    service = ts_worker.load(mar, tmp_path / fmt / "tmp", monkeypatch, gpu=0)
    image, _ = _golden(export_dir)
    ((status, answer),) = ts_worker.infer(service, [tensors_body({"image": image})])
    assert status == 200, answer
    return service._entry_point.__self__, np.asarray(answer["outputs"]["logits"])


@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "pt2"])
def test_torchserve_worker_given_a_gpu(
    exported: ExportResult, fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchScript loads on cuda:0. ONNX does where ONNX Runtime has its CUDA provider, and
    says it serves on CPU where not; a `.pt2` compiled for CPU serves on CPU."""
    written_or_skip(exported, fmt)
    handler, got = _served(exported.out_dir, fmt, tmp_path, monkeypatch)
    _, logits = _golden(exported.out_dir)
    np.testing.assert_allclose(got, logits.numpy(), atol=ATOL, rtol=RTOL)
    import onnxruntime

    on_gpu = {
        "torchscript": True,
        "onnx": "CUDAExecutionProvider" in onnxruntime.get_available_providers(),
        "pt2": False,
    }[fmt]
    assert handler.device == (torch.device("cuda:0") if on_gpu else torch.device("cpu"))


def test_torchserve_worker_runs_a_cuda_package_on_its_gpu(
    cuda_export: ExportResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, got = _served(cuda_export.out_dir, "pt2", tmp_path, monkeypatch)
    _, logits = _golden(cuda_export.out_dir)
    np.testing.assert_allclose(got, logits.numpy(), atol=ATOL, rtol=RTOL)
    assert handler.device == torch.device("cuda:0")
    info = json.loads((cuda_export.out_dir / "manifest.json").read_text())
    assert info["artifacts"]["pt2"]["device"] == "cuda"


@pytest.mark.parametrize(
    ("fmt", "device", "where"),
    [
        ("torchscript", "cuda:0", "cuda:0"),
        ("pt2", "cuda", "cpu"),  # compiled for CPU: it runs there, as the handler's does
    ],
)
def test_the_kserve_and_ray_loader_on_cuda(
    exported: ExportResult, fmt: str, device: str, where: str
) -> None:
    """serving.loading, which KServe's workers and Ray's replicas load through ("auto" on
    this machine: tests/integration/test_worker_device.py)."""
    written_or_skip(exported, fmt)
    loaded = loading.load(exported.out_dir, fmt, 1, device=device)
    assert loaded.device == where
    image, logits = _golden(exported.out_dir)
    (got,) = loaded.forward({"image": image.numpy()})
    np.testing.assert_allclose(got, logits.numpy(), atol=ATOL, rtol=RTOL)


def test_the_loader_runs_a_cuda_package_on_the_gpu(cuda_export: ExportResult) -> None:
    for device in ("auto", "cpu"):  # a CUDA package runs on its GPU either way
        loaded = loading.load(cuda_export.out_dir, "pt2", 1, device=device)
        assert loaded.device == "cuda:0"
        image, logits = _golden(cuda_export.out_dir)
        (got,) = loaded.forward({"image": image.numpy()})
        np.testing.assert_allclose(got, logits.numpy(), atol=ATOL, rtol=RTOL)


def test_verify_on_cuda_with_the_cpp_client(
    binary: Path, exported: ExportResult, cuda_export: ExportResult, tmp_path: Path
) -> None:
    """`pipeline verify --device cuda --with-cpp`: every backend against eager on CPU, at the
    manifest's own tolerance, each where it can run on this machine (the report says)."""
    import onnxruntime

    from pipeline.verify import VerifyConfig, verify

    for name, export_dir in (("cpu", exported.out_dir), ("cuda", cuda_export.out_dir)):
        report = verify(
            VerifyConfig(
                model="digits_lenet", export_dir=export_dir, with_cpp=True, cpp_binary=binary,
                report=tmp_path / name / "p.json", device="cuda",
            )
        )  # fmt: skip
        assert report.passed, report.failure_message()
        (note,) = [n for n in report.notes if n.startswith("--device cuda:0")]
        if name == "cpu":
            assert "torchscript on cuda:0" in note and "cpp on cuda:0" in note, note
            cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
            assert f"onnxruntime on {'cuda:0' if cuda else 'cpu'}" in note, note
        else:  # the CUDA package, in Python and in C++
            assert "pt2 on cuda:0" in note and "cpp/pt2 on cuda:0" in note, note
