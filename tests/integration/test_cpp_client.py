"""The LibTorch C++ client: a real CMake build, run on every zoo model, compared with eager."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

from pipeline.export import ExportResult
from pipeline.formats import cpp
from pipeline.verify import VerifyConfig, verify
from tests.conftest import run_cli

MODELS = ["digits_lenet", "my_decision_gate", "my_cell", "my_rnn_loop", "wrap_rnn"]


@pytest.fixture(scope="module")
def family_exports(all_exports: dict[str, ExportResult]) -> dict[str, ExportResult]:
    return all_exports


@pytest.mark.parametrize("name", MODELS)
def test_cpp_parity(
    binary: Path, family_exports: dict[str, ExportResult], name: str, tmp_path: Path
) -> None:
    report = verify(
        VerifyConfig(
            model=name,
            export_dir=family_exports[name].out_dir,
            backends=("cpp",),
            cpp_binary=binary,
            report=tmp_path / "p.json",
        )
    )
    assert report.passed, report.failure_message()
    # The client runs both the TorchScript file ("cpp") and the .pt2 package ("cpp/pt2").
    for backend in ("cpp", "cpp/pt2"):
        cpp_cases = {r.inputs for r in report.rows if r.backend == backend}
        assert "golden" in cpp_cases, backend
        assert any(c.startswith("probe") for c in cpp_cases)
        assert "random b=1" in cpp_cases  # batch 1 passes the package's input check
        if name != "digits_lenet":  # both branches of the gate, and new sequence lengths
            assert any("+" in c or ">0" in c for c in cpp_cases)
            assert any("-" in c or "<0" in c for c in cpp_cases)
        if name in ("my_rnn_loop", "wrap_rnn"):
            assert any("seq=13" in c for c in cpp_cases)


def test_latency_statistics_and_tuple_outputs(
    binary: Path, family_exports: dict[str, ExportResult]
) -> None:
    model = family_exports["my_cell"].out_dir / "model.torchscript.pt"
    x, h = torch.randn(3, 4), torch.randn(3, 4)
    done = cpp.run(model, [[x, h]], binary=binary, threads=1, warmup=2, repeat=15)
    assert len(done.outputs[0]) == 2  # the (new_h, new_h) tuple, flattened
    expected = torch.jit.load(str(model))(x, h)
    torch.testing.assert_close(done.outputs[0][0], expected[0], rtol=0, atol=0)
    stats = done.stats
    assert stats["runs"] == 15
    assert stats["threads"] == 1
    assert stats["device"] == "cpu"
    assert 0 < stats["p50_ms"] <= stats["p90_ms"] <= stats["p99_ms"] <= stats["max_ms"]
    assert stats["min_ms"] <= stats["mean_ms"] <= stats["max_ms"]


def _client(binary: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_errors_name_the_file_and_the_problem(
    binary: Path, family_exports: dict[str, ExportResult], tmp_path: Path
) -> None:
    model = family_exports["digits_lenet"].out_dir / "model.torchscript.pt"
    good_inputs = tmp_path / "in.pt"
    torch.save([torch.zeros(2, 1, 28, 28)], good_inputs)

    proc = _client(binary)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr

    proc = _client(binary, "--model", tmp_path / "missing.pt", "--inputs", good_inputs)
    assert proc.returncode == 3
    assert f"cannot load TorchScript model {tmp_path / 'missing.pt'}" in proc.stderr

    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(model.read_bytes()[:5000])
    proc = _client(binary, "--model", corrupt, "--inputs", good_inputs)
    assert proc.returncode == 3
    assert f"cannot load TorchScript model {corrupt}" in proc.stderr

    proc = _client(binary, "--model", model, "--inputs", tmp_path / "none.pt")
    assert proc.returncode == 4
    assert "cannot open inputs file" in proc.stderr

    wrong = tmp_path / "wrong.pt"
    torch.save([torch.zeros(2, 3, 28, 28)], wrong)
    proc = _client(binary, "--model", model, "--inputs", wrong)
    assert proc.returncode == 5
    assert "the model rejected inputs [[2, 3, 28, 28] Float]" in proc.stderr
    assert str(wrong) in proc.stderr

    proc = _client(binary, "--model", model, "--inputs", good_inputs, "--repeat", "0")
    assert proc.returncode == 2
    assert "--repeat must be at least 1 (a whole number), got '0'" in proc.stderr

    proc = _client(binary, "--model", model, "--inputs", good_inputs, "--verbose")
    assert proc.returncode == 2  # an unknown flag last was "missing value after --verbose"
    assert "unknown argument --verbose (see --help)" in proc.stderr

    proc = _client(binary, "--help")  # asked for: on stdout, so `--help | less` shows it
    assert proc.returncode == 0 and "--inputs" in proc.stdout and not proc.stderr, proc


class _Difference(torch.nn.Module):
    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return x - h


class _Masked(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:  # noqa: UP045 - TorchScript
        return x if mask is None else x * mask


def test_a_dict_of_inputs_binds_by_forward_s_argument_names(binary: Path, tmp_path: Path) -> None:
    """cpp-client.md takes {name: tensor}; a dict saved in another order than forward()'s
    arguments was bound by insertion order (x - h gave -4 for 4). Keys that are not the
    argument names (a golden file's manifest names) still bind in their order."""
    model = tmp_path / "difference.pt"
    torch.jit.script(_Difference()).save(str(model))
    for keys, expected in ((("h", "x"), 4.0), (("a", "b"), -4.0)):
        inputs, outputs = tmp_path / "in.pt", tmp_path / "out.pt"
        torch.save({keys[0]: torch.ones(2, 3), keys[1]: 5 * torch.ones(2, 3)}, inputs)
        proc = _client(binary, "--model", model, "--inputs", inputs, "--outputs", outputs)
        assert proc.returncode == 0, proc.stderr
        (answer,) = torch.load(outputs)[0]
        torch.testing.assert_close(answer, torch.full((2, 3), expected))
    # One name forward() has and one it has not (a typo): taken in the file's order, h was
    # fed as x (exit 0, wrong numbers). Refused now, naming both.
    torch.save({"h": torch.ones(2, 3), "X": 5 * torch.ones(2, 3)}, inputs)
    proc = _client(binary, "--model", model, "--inputs", inputs, "--outputs", outputs)
    assert proc.returncode == 4, proc.stderr
    assert "the inputs are named [h, X], not as the model's [x, h]" in proc.stderr
    # Some of forward()'s names, the others defaulted: bound by name, the rest left out.
    masked = tmp_path / "masked.pt"
    torch.jit.script(_Masked()).save(str(masked))
    torch.save({"x": 3 * torch.ones(2, 3)}, inputs)
    proc = _client(binary, "--model", masked, "--inputs", inputs, "--outputs", outputs)
    assert proc.returncode == 0, proc.stderr
    torch.testing.assert_close(torch.load(outputs)[0][0], 3 * torch.ones(2, 3))
    proc = _client(binary, "--model", model, "--inputs", tmp_path)  # a folder, not a file
    assert proc.returncode == 4 and f"inputs file {tmp_path} is a directory" in proc.stderr


def test_built_with_the_wheels_nvcc_and_no_system_toolkit(binary: Path) -> None:
    # The session's build ran with no nvcc on PATH and no system toolkit visible
    # (tests/conftest.py); its CMake cache shows what it compiled with.
    if torch.version.cuda is None:
        pytest.skip("a CPU-only torch needs no CUDA compiler")
    cache = (binary.parent / "CMakeCache.txt").read_text()
    toolkit = binary.parent / "cuda-toolkit"
    assert f"CMAKE_CUDA_COMPILER:STRING={toolkit}/bin/nvcc" in cache
    assert cpp.configured_toolkit(binary.parent) == str(toolkit)
    assert (toolkit / "bin" / "nvcc").resolve().is_relative_to(Path(torch.__file__).parents[1])
    assert not [ln for ln in cache.splitlines() if "/usr/local/cuda" in ln and "IGNORE" not in ln]


def test_cpu_only_machine_is_told_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if torch.version.cuda is None:
        pytest.skip("a CPU-only torch needs no CUDA toolkit")
    # A venv without NVIDIA's compiler wheels, on a machine without a toolkit.
    monkeypatch.setattr(cpp, "_wheel_cuda_dirs", lambda: [])
    monkeypatch.setenv("PIPELINE_CUDA_ROOTS", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(cpp.CppError, match=r"CUDA \d+(\.\d+)? build.*Run `make venv`"):
        cpp.cmake_args(tmp_path)


def test_command_line_prints_json(
    binary: Path, family_exports: dict[str, ExportResult], tmp_path: Path
) -> None:
    inputs = tmp_path / "in.pt"
    torch.save([torch.randn(5, 2, 4)], inputs)
    proc = _client(
        binary, "--model", family_exports["wrap_rnn"].out_dir / "model.torchscript.pt",
        "--inputs", inputs, "--outputs", tmp_path / "out.pt", "--repeat", "3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cases"] == 1
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out[0][0].shape == (2, 4)


def test_reads_an_exports_golden_file(
    binary: Path, family_exports: dict[str, ExportResult], tmp_path: Path
) -> None:
    export_dir = family_exports["my_cell"].out_dir
    proc = _client(
        binary, "--model", export_dir / "model.torchscript.pt",
        "--inputs", export_dir / "golden.pt", "--outputs", tmp_path / "out.pt",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    golden = torch.load(export_dir / "golden.pt", weights_only=True)
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    torch.testing.assert_close(out[0][0], golden["outputs"]["y"], rtol=0, atol=0)


def test_latency_is_reported_next_to_python_for_digits_and_resnet18(
    binary: Path, family_exports: dict[str, ExportResult], resnet18_cli: dict[str, Any]
) -> None:
    """Both numbers come from one run (interleaved rounds); the ratio is reported, not asserted.
    resnet18 is the session's `pipeline export --model torchvision:resnet18 --random-init`
    (test_user_models verifies it): its TorchScript file is what both clients run."""
    assert resnet18_cli["returncode"] == 0, resnet18_cli["stderr"]
    cases = {
        "digits_lenet": family_exports["digits_lenet"].out_dir / "model.torchscript.pt",
        "resnet18": Path(resnet18_cli["export_dir"]) / "model.torchscript.pt",
    }
    shapes = {"digits_lenet": (1, 1, 28, 28), "resnet18": (1, 3, 224, 224)}
    for name, model in cases.items():
        result = cpp.compare_latency(
            model, [torch.rand(shapes[name])], binary=binary, repeat=5, warmup=2, rounds=2
        )
        assert result["batch"] == 1
        assert result["cpp"]["runs"] == 5
        assert result["python"]["runs"] == 5
        assert result["cpp"]["p50_ms"] > 0
        assert result["python"]["p50_ms"] > 0
        assert result["cpp_over_python_p50"] == pytest.approx(
            result["cpp"]["p50_ms"] / result["python"]["p50_ms"]
        )
    # From the command line, with the client built where the user said (`build-cpp
    # --build-dir`): latency had no --cpp-build-dir and built its own in cpp_client/build.
    artifacts = Path(resnet18_cli["export_dir"]).parent.parent
    proc = run_cli("--artifacts-dir", artifacts, "latency", "--model", "torchvision:resnet18",
                   "--cpp-build-dir", binary.parent, "--repeat", "3", "--warmup", "1",
                   "--rounds", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "C++ / Python" in proc.stdout and "torchvision:resnet18" in proc.stdout, proc.stdout
