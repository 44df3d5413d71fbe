"""The C++ client on AOTInductor `.pt2` packages: a real build, real packages, held against
Python's `aoti_load_package` and eager; corrupt packages, wrong inputs and wrong devices fail
with an exit code and a message, never a crash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
import torch

from pipeline.formats import cpp

ATOL = RTOL = 1e-5


class Cell(torch.nn.Module):
    """Two inputs, two outputs (a tuple), a dynamic batch axis."""

    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.tanh(self.l(x) + h)
        return y, y.clone()


class Gate(torch.nn.Module):
    """Data-dependent control flow, exported as torch.cond."""

    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Branches must not return their input unchanged (../shared/DESIGN.md).
        return torch.cond(x.sum() > 0, lambda x: self.l(x), lambda x: -x, (x,))


def _compile(
    model: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path, **configs: object
) -> Path:
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, example, dynamic_shapes=tuple({0: batch} for _ in example))
    return Path(
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(path), inductor_configs=configs or None
        )
    )


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    """The cell with AOTInductor's default settings; the gate compiled to accept batch 1 under
    the input check (check_lowerbound=False)."""
    root = tmp_path_factory.mktemp("pt2")
    torch.manual_seed(0)
    cell, gate = Cell().eval(), Gate().eval()
    with torch.no_grad():
        return {
            "cell": (
                cell,
                _compile(cell, (torch.randn(3, 4), torch.randn(3, 4)), root / "cell.pt2"),
            ),
            "gate": (
                gate,
                _compile(
                    gate,
                    (torch.randn(3, 4),),
                    root / "gate.pt2",
                    **{"aot_inductor.check_lowerbound": False},
                ),
            ),
        }


def _client(binary: Path, *args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    # Without the user's own AOTI_RUNTIME_CHECK_INPUTS, so the client's default is what is tested.
    base = {k: v for k, v in os.environ.items() if k != "AOTI_RUNTIME_CHECK_INPUTS"}
    return subprocess.run(
        [str(binary), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
    )


def _cases(name: str) -> list[list[torch.Tensor]]:
    torch.manual_seed(1)
    if name == "cell":
        return [[torch.randn(b, 4), torch.randn(b, 4)] for b in (2, 5, 17)]
    positive = [[torch.rand(b, 4) + 0.1] for b in (1, 3, 8)]  # x.sum() > 0
    return [*positive, *[[-t for t in case] for case in positive]]  # and < 0


@pytest.mark.parametrize("name", ["cell", "gate"])
def test_outputs_match_python_and_eager_at_several_batch_sizes(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], name: str
) -> None:
    eager, package = packages[name]
    cases = _cases(name)
    done = cpp.run(package, cases, binary=binary, threads=1)
    assert done.stats["format"] == "pt2"
    assert done.stats["cases"] == len(cases)
    python = torch._inductor.aoti_load_package(str(package))
    for inputs, got in zip(cases, done.outputs, strict=True):
        with torch.no_grad():
            expected = [eager(*inputs)] if name == "gate" else list(eager(*inputs))
            from_python = python(*inputs)
        from_python = [from_python] if isinstance(from_python, torch.Tensor) else list(from_python)
        assert len(got) == len(expected) == len(from_python)
        for g, e, p in zip(got, expected, from_python, strict=True):
            assert g.shape[0] == inputs[0].shape[0]
            torch.testing.assert_close(g, p, atol=ATOL, rtol=RTOL)
            torch.testing.assert_close(g, e, atol=ATOL, rtol=RTOL)
    if name == "gate":  # both branches were taken: -x for the negative half only
        negated = [
            bool((out[0] == -inp[0]).all()) for inp, out in zip(cases, done.outputs, strict=True)
        ]
        assert negated == [False] * 3 + [True] * 3


def test_latency_json_and_format(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], tmp_path: Path
) -> None:
    _, package = packages["cell"]
    inputs = tmp_path / "in.pt"
    torch.save([torch.randn(4, 3).t(), torch.randn(3, 4)], inputs)  # x transposed: not contiguous
    proc = _client(
        binary, "--model", package, "--inputs", inputs, "--outputs", tmp_path / "out.pt",
        "--threads", "1", "--warmup", "2", "--repeat", "9",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert stats["format"] == "pt2"
    assert stats["model"] == str(package)
    assert (stats["runs"], stats["threads"], stats["device"]) == (9, 1, "cpu")
    assert 0 < stats["p50_ms"] <= stats["p90_ms"] <= stats["p99_ms"] <= stats["max_ms"]
    x, h = torch.load(inputs, weights_only=True)
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    expected = torch._inductor.aoti_load_package(str(package))(x.contiguous(), h)
    torch.testing.assert_close(out[0][0], expected[0], atol=ATOL, rtol=RTOL)

    # A package is found by its content too, whatever its name; TorchScript says so.
    renamed = tmp_path / "cell.model"
    shutil.copy(package, renamed)
    assert cpp.is_pt2(renamed)
    proc = _client(binary, "--model", renamed, "--inputs", inputs)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == "pt2"
    scripted = tmp_path / "cell.torchscript.pt"
    torch.jit.script(packages["cell"][0]).save(str(scripted))
    assert not cpp.is_pt2(scripted)
    proc = _client(binary, "--model", scripted, "--inputs", inputs)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == "torchscript"


def test_broken_packages_exit_3_naming_the_file(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], tmp_path: Path
) -> None:
    _, package = packages["cell"]
    inputs = tmp_path / "in.pt"
    torch.save([torch.randn(3, 4), torch.randn(3, 4)], inputs)
    data = package.read_bytes()
    (tmp_path / "random.pt2").write_bytes(os.urandom(4096))
    (tmp_path / "truncated.pt2").write_bytes(data[: len(data) // 2])

    class AddOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    # torch.export.save also writes .pt2 files, but holds no compiled model.
    torch.export.save(torch.export.export(AddOne(), (torch.randn(2),)), tmp_path / "program.pt2")
    for name, reason in [
        ("random.pt2", "not a readable .pt2 archive"),
        ("truncated.pt2", "not a readable .pt2 archive"),
        ("missing.pt2", "no such file"),
        ("program.pt2", "the archive holds no compiled model"),
    ]:
        proc = _client(binary, "--model", tmp_path / name, "--inputs", inputs)
        assert proc.returncode == 3, (name, proc.returncode, proc.stderr)
        assert f"cannot load AOTInductor package {tmp_path / name}: {reason}" in proc.stderr


def test_package_for_another_device_exits_7(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], tmp_path: Path
) -> None:
    """A CPU-only machine has no CUDA package: make one claim CUDA in its metadata."""
    _, package = packages["cell"]
    claims_cuda = tmp_path / "claims_cuda.pt2"
    with zipfile.ZipFile(package) as src, zipfile.ZipFile(claims_cuda, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("_metadata.json"):
                meta = json.loads(data)
                assert meta["AOTI_DEVICE_KEY"] == "cpu"
                data = json.dumps({**meta, "AOTI_DEVICE_KEY": "cuda"}).encode()
            dst.writestr(item, data)
    inputs = tmp_path / "in.pt"
    torch.save([torch.randn(3, 4), torch.randn(3, 4)], inputs)
    proc = _client(binary, "--model", claims_cuda, "--inputs", inputs, "--device", "cpu")
    assert proc.returncode == 7, proc.stderr
    assert f"{claims_cuda} was compiled for cuda and cannot run on --device cpu" in proc.stderr


WRONG_INPUTS = {
    "dtype": ([torch.randn(3, 4).double(), torch.randn(3, 4)], "unmatched dtype"),
    "width": ([torch.randn(3, 5), torch.randn(3, 4)], "unmatched dim value at 1"),
    "rank": ([torch.randn(4), torch.randn(3, 4)], "unmatched dim value at 1"),
    "count": ([torch.randn(3, 4)], "expected inputs vector size to be 2, but got 1"),
    "batches differ": ([torch.randn(3, 4), torch.randn(2_000, 4)], "expected size"),
    "batch 1": ([torch.randn(1, 4), torch.randn(1, 4)], "aot_inductor.check_lowerbound"),
}


@pytest.mark.parametrize("kind", list(WRONG_INPUTS))
def test_wrong_inputs_exit_5_without_a_crash(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], tmp_path: Path, kind: str
) -> None:
    tensors, cause = WRONG_INPUTS[kind]
    inputs = tmp_path / "in.pt"
    torch.save(tensors, inputs)
    proc = _client(binary, "--model", packages["cell"][1], "--inputs", inputs)
    assert proc.returncode == 5, (proc.returncode, proc.stderr)  # not -11: no segfault
    assert f"case 0 of {inputs}: the model rejected inputs [" in proc.stderr
    assert cause in proc.stderr


def test_input_check_can_be_switched_off(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], tmp_path: Path
) -> None:
    """A user's AOTI_RUNTIME_CHECK_INPUTS=0 wins; batch 1 then runs (export assumed >= 2)."""
    eager, package = packages["cell"]
    x, h = torch.randn(1, 4), torch.randn(1, 4)
    torch.save([x, h], tmp_path / "in.pt")
    proc = _client(
        binary, "--model", package, "--inputs", tmp_path / "in.pt", "--outputs", tmp_path / "out.pt",
        AOTI_RUNTIME_CHECK_INPUTS="0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    with torch.no_grad():
        torch.testing.assert_close(out[0][0], eager(x, h)[0], atol=ATOL, rtol=RTOL)


def test_python_latency_and_compare_latency_take_pt2(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]]
) -> None:
    _, package = packages["gate"]
    inputs = [torch.rand(1, 4)]
    stats = cpp.python_latency(package, inputs, threads=1, warmup=1, repeat=5)
    assert stats["format"] == "pt2"
    assert stats["runs"] == 5
    assert 0 < stats["p50_ms"] <= stats["p99_ms"]
    result = cpp.compare_latency(package, inputs, binary=binary, warmup=1, repeat=5, rounds=1)
    assert result["cpp"]["format"] == result["python"]["format"] == "pt2"
    assert result["batch"] == 1
    assert result["cpp_over_python_p50"] > 0

    with pytest.raises(cpp.CppError, match="Cannot load the AOTInductor package"):
        cpp.python_latency(package.with_name("missing.pt2"), inputs, threads=1, warmup=0, repeat=1)


def test_ensure_built_rebuilds_after_a_source_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Path] = []
    monkeypatch.setattr(cpp, "build", lambda build_dir=None: built.append(build_dir) or build_dir)
    binary = cpp.binary_path(tmp_path)
    binary.write_bytes(b"")
    future = time.time() + 3600
    os.utime(binary, (future, future))
    assert cpp.ensure_built(tmp_path) == binary
    assert built == []
    newest = max(p.stat().st_mtime for p in (cpp.SOURCE_DIR / "src").glob("*.cpp"))
    os.utime(binary, (newest - 10, newest - 10))  # as if inference.cpp was edited after the build
    cpp.ensure_built(tmp_path)
    assert built == [tmp_path]


@pytest.mark.gpu
def test_cuda_package_runs_with_device_cuda(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    eager = Cell().eval().cuda()
    example = (torch.randn(3, 4, device="cuda"), torch.randn(3, 4, device="cuda"))
    with torch.no_grad():
        package = _compile(eager, example, tmp_path / "cell_cuda.pt2")
    cases = [[torch.randn(b, 4), torch.randn(b, 4)] for b in (2, 9)]
    done = cpp.run(package, cases, binary=binary, device="cuda:0", repeat=3)
    assert (done.stats["device"], done.stats["format"]) == ("cuda:0", "pt2")
    for inputs, got in zip(cases, done.outputs, strict=True):
        with torch.no_grad():
            expected = eager(*(t.cuda() for t in inputs))
        torch.testing.assert_close(got[0], expected[0].cpu(), atol=1e-4, rtol=1e-4)

    torch.save(cases[0], tmp_path / "in.pt")
    proc = _client(binary, "--model", package, "--inputs", tmp_path / "in.pt", "--device", "cpu")
    assert proc.returncode == 7, proc.stderr
    assert "was compiled for cuda and cannot run on --device cpu" in proc.stderr
    cpu_package = packages["cell"][1]
    proc = _client(
        binary, "--model", cpu_package, "--inputs", tmp_path / "in.pt", "--device", "cuda"
    )
    assert proc.returncode == 7, proc.stderr
    assert "was compiled for cpu and cannot run on --device cuda" in proc.stderr


def test_a_named_inputs_file_is_bound_by_name_in_an_export_folder(
    binary: Path, packages: dict[str, tuple[torch.nn.Module, Path]], tmp_path: Path
) -> None:
    """A {name: tensor} file in another order than forward()'s: TorchScript binds it by
    name, a .pt2 bound it in the file's order (x and h swapped, exit 0). In an export
    folder the package's golden.pt names its inputs."""
    eager, package = packages["cell"]
    folder = tmp_path / "export"
    folder.mkdir()
    shutil.copy(package, folder / "model.pt2")
    x, h = torch.randn(3, 4), torch.randn(3, 4) * 5
    torch.save({"inputs": {"x": x[:1], "h": h[:1]}}, folder / "golden.pt")  # forward()'s order
    torch.save({"h": h, "x": x}, tmp_path / "reversed.pt")
    proc = _client(binary, "--model", folder / "model.pt2", "--inputs", tmp_path / "reversed.pt",
                   "--outputs", tmp_path / "out.pt", "--repeat", "1", "--warmup", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (got,) = torch.load(tmp_path / "out.pt", weights_only=True)
    with torch.no_grad():
        torch.testing.assert_close(got[0], eager(x, h)[0], atol=ATOL, rtol=RTOL)
