"""Custom operators in a TorchScript artifact (torchvision::nms, as a scripted detector calls):
export records the library in the manifest (`op_libraries`), Python's loader loads it before
`torch.jit.load`, and the C++ client dlopens libpython, libtorch_python and torchvision's
`_C_stable.so` (`--load-library`) before the model. Without them both fail to load the file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline.export import ExportConfig, export
from pipeline.formats import cpp
from pipeline.verify import VerifyConfig, verify
from pipeline.zoo.user import parse_input
from pipeline_runtime import oplibs

# A user's model whose submodule calls torchvision.ops.nms; its outputs have the shapes
# of a detector's: boxes [K, 4] float32, scores [K], kept indices [K] int64 and the count
# [1] int64, where K depends on the input (0 for no boxes).
MODEL_SOURCE = """
import torch
import torchvision
from torch import Tensor, nn


class Keep(nn.Module):
    def forward(self, boxes: Tensor, scores: Tensor) -> Tensor:
        return torchvision.ops.nms(boxes, scores, 0.5)


class KeepBoxes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.keep = Keep()

    def forward(self, boxes: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        # (x, y, w, h) -> (x1, y1, x2, y2): valid boxes from any non-negative input
        boxes = torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1)
        kept = self.keep(boxes, scores)
        return boxes[kept], scores[kept], kept, kept.new_full((1,), kept.shape[0])
"""
INPUTS = ["boxes:float32:n,4:0:10", "scores:float32:n"]
OUTPUTS = ["boxes", "scores", "kept", "count"]
LIBRARIES = ["torchvision"]


@pytest.fixture(scope="module")
def nms_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(model, export dir): the model scripted (--method script), TorchScript only."""
    root = tmp_path_factory.mktemp("nms")
    (root / "nms_model.py").write_text(MODEL_SOURCE)
    model = f"{root / 'nms_model.py'}:KeepBoxes"
    result = export(
        ExportConfig(
            model=model,
            inputs=[parse_input(s) for s in INPUTS],
            outputs=OUTPUTS,
            random_init=True,
            method="script",
            formats=("torchscript",),
            checkpoint=root / "checkpoint.pt",
            out_dir=root / "export",
        )
    )
    return model, result.out_dir


def _record(export_dir: Path) -> dict:
    return json.loads((export_dir / "manifest.json").read_text())["artifacts"]["torchscript"]


def _cases() -> list[list[torch.Tensor]]:
    """No boxes, a few, many: the kept count differs from case to case."""
    gen = torch.Generator().manual_seed(0)
    return [
        [torch.rand(n, 4, generator=gen) * 10, torch.rand(n, generator=gen)] for n in (0, 5, 40)
    ]


def test_export_records_the_library_and_the_helper_names_its_chain(
    nms_export: tuple[str, Path],
) -> None:
    record = _record(nms_export[1])
    assert record["method"] == "script"  # a scripted module whose submodule calls nms
    assert record[oplibs.OP_LIBRARIES_KEY] == LIBRARIES
    # Absent for a module calling no custom operator.
    assert oplibs.op_libraries_of(torch.jit.script(torch.nn.Linear(2, 2))) == []

    paths = oplibs.cpp_library_paths(record[oplibs.OP_LIBRARIES_KEY])
    assert [p.name.split(".so")[0] for p in paths] == [
        f"libpython{sys.version_info.major}.{sys.version_info.minor}",
        "libtorch_python",
        "_C_stable",
    ]
    assert all(p.is_file() for p in paths), paths
    assert paths[1].parent == Path(torch.__file__).parent / "lib"


def test_verify_runs_the_cpp_client_with_the_libraries(
    binary: Path, nms_export: tuple[str, Path], tmp_path: Path
) -> None:
    model, export_dir = nms_export
    report = verify(
        VerifyConfig(
            model=model,
            export_dir=export_dir,
            backends=("torchscript", "cpp"),
            cpp_binary=binary,
            report=tmp_path / "p.json",
        )
    )
    assert report.passed, report.failure_message()
    assert {r.backend for r in report.rows} >= {"torchscript", "cpp"}
    assert {r.output for r in report.rows if r.backend == "cpp"} == set(OUTPUTS)


def test_cpp_outputs_of_varying_sizes_equal_python(
    binary: Path, nms_export: tuple[str, Path]
) -> None:
    model = nms_export[1] / "model.torchscript.pt"
    cases = _cases()
    done = cpp.run(model, cases, binary=binary, op_libraries=LIBRARIES)
    expected = torch.jit.load(str(model))  # torchvision is imported here (the model file)
    kept = []
    for inputs, got in zip(cases, done.outputs, strict=True):
        want = expected(*inputs)
        assert len(got) == len(want) == 4
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        assert [t.dtype for t in got] == [torch.float32, torch.float32, torch.int64, torch.int64]
        kept.append(int(got[3]))
    assert kept[0] == 0 and len(set(kept)) == 3, kept  # first axes of 0 and two other sizes


def _client(binary: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_cpp_client_without_the_libraries_names_the_op(
    binary: Path, nms_export: tuple[str, Path], tmp_path: Path
) -> None:
    model = nms_export[1] / "model.torchscript.pt"
    inputs = tmp_path / "in.pt"
    torch.save(_cases()[1], inputs)
    base = ("--model", model, "--inputs", inputs)

    proc = _client(binary, *base)
    assert proc.returncode == 3, proc.stderr
    assert f"error: cannot load TorchScript model {model}: " in proc.stderr
    assert "Unknown builtin op: torchvision::nms" in proc.stderr
    assert "--load-library" in proc.stderr

    # torchvision's library alone does not load: it needs libtorch_python, which needs libpython.
    paths = oplibs.cpp_library_paths(LIBRARIES)
    proc = _client(binary, *base, "--load-library", paths[-1])
    assert proc.returncode == 8, proc.stderr
    assert f"error: cannot load library {paths[-1]} (--load-library): " in proc.stderr
    assert "libtorch_python.so" in proc.stderr

    proc = _client(binary, *base, *(a for p in paths for a in ("--load-library", p)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cases"] == 1


def test_python_loader_loads_the_library_in_a_fresh_process(
    nms_export: tuple[str, Path], tmp_path: Path
) -> None:
    """A process that never imported torchvision: the bare load fails on the op, the
    loader given the manifest's record loads it and answers as this process does."""
    model = nms_export[1] / "model.torchscript.pt"
    boxes, scores = _cases()[2]
    torch.save({"boxes": boxes, "scores": scores}, tmp_path / "in.pt")
    script = textwrap.dedent(
        f"""
        import json, sys
        import torch
        from pipeline_runtime import runners
        model, folder = {str(model)!r}, {str(tmp_path)!r}
        record = json.load(open({str(nms_export[1] / "manifest.json")!r}))["artifacts"]["torchscript"]
        names = dict(inputs={["boxes", "scores"]!r}, outputs={OUTPUTS!r})
        assert "torchvision" not in sys.modules
        try:
            runners.load("torchscript", model, **names)
            raise SystemExit("loaded without the op library")
        except RuntimeError as err:
            assert "torchvision::nms" in str(err), err
        assert "torchvision" not in sys.modules
        runner = runners.load("torchscript", model, **names, record=record)
        torch.save(runner(torch.load(folder + "/in.pt")), folder + "/out.pt")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    want = torch.jit.load(str(model))(boxes, scores)
    assert list(got) == OUTPUTS
    for g, w in zip(got.values(), want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_missing_libraries_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(oplibs.OpLibraryError, match=r"unknown op library \['torchaudio'\]"):
        oplibs.cpp_library_paths(["torchaudio"])

    monkeypatch.setitem(oplibs.KNOWN, "no_such_op_package", ("_C.so",))
    with pytest.raises(oplibs.OpLibraryError, match="no_such_op_package is not installed"):
        oplibs.load_op_libraries(["no_such_op_package"])
    with pytest.raises(oplibs.OpLibraryError, match="no_such_op_package is not installed"):
        oplibs.cpp_library_paths(["no_such_op_package"])
    # cpp.run says so before starting the client (no binary is run here).
    with pytest.raises(cpp.CppError, match="no_such_op_package is not installed"):
        cpp.run(
            tmp_path / "m.pt", [], binary=tmp_path / "none", op_libraries=["no_such_op_package"]
        )

    monkeypatch.setitem(oplibs.KNOWN, "torchvision", ("_C_missing.so",))
    with pytest.raises(oplibs.OpLibraryError, match=r"has no compiled op library.*_C_missing\.so"):
        oplibs.cpp_library_paths(LIBRARIES)

    real = oplibs.sysconfig.get_config_var
    monkeypatch.setattr(
        oplibs.sysconfig,
        "get_config_var",
        lambda key: str(tmp_path) if key == "LIBDIR" else real(key),
    )
    with pytest.raises(oplibs.OpLibraryError, match=r"no shared libpython found \(looked at "):
        oplibs.libpython()
