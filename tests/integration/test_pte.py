"""ExecuTorch `.pte` (issue 53): exported, verified in ExecuTorch's runtime and in a C++
runner that links no LibTorch, partial with a reason where ExecuTorch cannot run a model,
and never served.

The digits CNN's `.pte` comes from the session's `exported` (every float32 format); the
control-flow gate (torch.cond) and the tutorial loop are exported here, once per module.
The registry-walking tests (test_formats.py) hold the format to the same export and
verify contract as the others.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.export import ExportConfig, ExportResult, export
from pipeline.export.partial import partial_message
from pipeline.formats import pte_runner
from pipeline.runtimes.kserve.launch import served_export
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.serving import served
from pipeline.serving.server import ServeError
from pipeline.verify import VerifyConfig, verify
from pipeline.zoo.user import parse_input
from tests.conftest import assert_clean_error, run_cli

GATE, LOOP = "my_decision_gate", "my_rnn_loop"


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """The data-dependent branch (exported through its torch.cond formulation) as a .pte;
    it has no parameters, so its random initialisation is the trained model."""
    out = tmp_path_factory.mktemp("pte_gate") / "export"
    return export(ExportConfig(model=GATE, random_init=True, out_dir=out, formats=("pte",)))


@pytest.fixture(scope="module")
def runner() -> Path:
    return pte_runner.ensure_built()


def test_the_runner_links_no_libtorch_and_reports_its_size(runner: Path) -> None:
    libraries = pte_runner.linked(runner)
    assert not [n for n in libraries if "torch" in n and "executorch" not in n], libraries
    assert "libexecutorch.so" in libraries and "libexecutorch_backend_xnnpack.so" in libraries
    size = pte_runner.footprint(runner)
    assert size["libtorch"] == []
    assert size["total_bytes"] == size["runner_bytes"] + sum(size["libraries"].values())
    assert 0 < size["runner_bytes"] < size["total_bytes"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--verbose"], "unknown flag --verbose"),  # last: it "needed a value"
        (["--warmup", "abc"], "--warmup must be 0 or more (a whole number), got 'abc'"),
        (["--repeat", "-5"], "--repeat must be at least 1 (a whole number), got '-5'"),
        (["--repeat", "abc"], "--repeat must be at least 1 (a whole number), got 'abc'"),
    ],
)
def test_the_runner_names_a_bad_flag(runner: Path, extra: list[str], said: str) -> None:
    proc = subprocess.run(
        [runner, "--model", "m.pte", "--inputs", "in", *extra], capture_output=True, text=True
    )
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_the_runner_says_a_missing_program_is_missing(runner: Path, tmp_path: Path) -> None:
    """It said "does not load: Error::AccessFailed (the runtime's log above names what is
    missing)", and no log named anything."""
    for model, said in ((tmp_path / "nope.pte", "does not exist"), (tmp_path, "is not a file")):
        proc = subprocess.run(
            [runner, "--model", model, "--inputs", tmp_path], capture_output=True, text=True
        )
        assert proc.returncode == 3 and f"{model} {said}" in proc.stderr, proc.stderr


def test_digits_pte_verifies_in_python_and_in_the_cpp_runner(
    exported: ExportResult, binary: Path, runner: Path, tmp_path: Path
) -> None:
    # The runner as `pipeline build-cpp --runner pte --build-dir DIR` leaves it (a copy, newer
    # than its sources, so not built again): verify's --pte-build-dir runs that one (it
    # used to build its own in cpp_client/pte_runner/build whatever it was given).
    elsewhere = pte_runner.binary_path(tmp_path / "pte-build")
    elsewhere.parent.mkdir(parents=True)
    shutil.copy2(runner, elsewhere)
    record = exported.manifest.artifact("pte")
    assert record.get("backend") == "xnnpack" and record.get("executorch") == "1.5.1"
    assert record.get("delegates") == ["XnnpackBackend"]
    assert record.get("delegation")["nodes_delegated"] > 0
    assert record.get("max_sizes") == {"batch": 64}
    report = verify(
        VerifyConfig(
            model="digits_lenet",
            export_dir=exported.out_dir,
            backends=("executorch", "cpp"),
            batch_sizes=(1, 7, 100),
            cpp_binary=binary,  # the session's LibTorch client runs the .pt2 and TorchScript
            pte_build_dir=tmp_path / "pte-build",
            report=tmp_path / "parity.json",
        )
    )
    assert report.passed, report.failure_message()
    ran = {r.backend for r in report.rows}
    assert {"executorch", "cpp/pte"} <= ran, ran
    # The report says what ran it and what a device carries: no libtorch.
    (runner_note,) = [n for n in report.notes if n.startswith("cpp/pte: ExecuTorch's runner")]
    assert "libtorch linked: none" in runner_note and "MiB" in runner_note
    assert f"ExecuTorch's runner {elsewhere} (" in runner_note, runner_note
    # A batch above the planned largest one is not run (it cannot be), and said so.
    assert not [
        r
        for r in report.rows
        if r.inputs == "random b=100" and r.backend in ("executorch", "cpp/pte")
    ]
    for backend in ("executorch", "cpp/pte"):
        assert any(
            n.startswith(f"{backend} was compiled for batch ≤ 64 only") for n in report.notes
        )
    # golden, its probes and the random batches, in both
    for backend in ("executorch", "cpp/pte"):
        cases = {r.inputs for r in report.rows if r.backend == backend}
        assert {"golden", "random b=1", "random b=7"} <= cases, (backend, cases)


def test_the_int8_pte_records_its_quantizer_delegation_and_verdict(
    precision_exported: ExportResult,
) -> None:
    """XNNPACK's quantizer, calibrated on the training split, lowered like the float .pte.
    Its verdicts: test_formats.py (ExecuTorch's runtime, accuracy on the validation split)
    and test_precision.py (the C++ runner)."""
    record = precision_exported.manifest.artifact("pte_int8")
    assert record.get("precision") == "int8" and record.get("delegates") == ["XnnpackBackend"]
    assert record.get("delegation")["nodes_delegated"] > 0
    assert record.get("quantizer")["quantizer"] == "XNNPACKQuantizer"
    assert record.get("calibration")["samples"] > 0 and record.get("max_sizes") == {"batch": 64}
    assert record.get("quality")["within_budget"] is True
    float_size = precision_exported.manifest.artifact("onnx_fp16").get("size_bytes")
    assert record.get("size_bytes") < float_size  # int8 weights: smaller than float16's


def test_the_branch_runs_as_torch_cond_in_both_runtimes(gate: ExportResult, tmp_path: Path) -> None:
    record = gate.manifest.artifact("pte")
    assert record.get("method") == "torch.export (torch.cond formulation)"
    # XNNPACK takes none of a sum, a comparison and a negation: said, not called "xnnpack"
    assert record.get("backend") == "portable" and record.get("delegates") == []
    assert "not delegated to XNNPACK (it took none of the model's operators)" in record.reason
    report = verify(
        VerifyConfig(
            model=GATE,
            export_dir=gate.out_dir,
            with_cpp=True,
            report=tmp_path / "parity.json",
        )
    )
    assert report.passed, report.failure_message()
    assert {"executorch", "cpp/pte"} <= {r.backend for r in report.rows}
    # On the CPU kernels the runtime probes the CPU at a process's first call: its lines
    # ("[cpuinfo_utils.cpp:71] Reading file ...") leaked into verify's output.
    proc = run_cli("verify", "--model", GATE, "--export-dir", gate.out_dir, "--backend",
                   "executorch", "--report", tmp_path / "again.json")  # fmt: skip
    assert proc.returncode == 0 and "cpuinfo" not in proc.stderr, proc.stderr
    # The probes take both branches (sum > 0 and sum ≤ 0): each was run by both.
    probes = {r.inputs for r in report.rows if r.backend == "cpp/pte" and "probe" in r.inputs}
    assert len(probes) >= 2, probes


def test_a_loop_executorch_cannot_run_is_partial_with_the_failing_kernel(tmp_path: Path) -> None:
    """In process (the command line's partial exit is test_partial_export.py's): the paragraph
    `pipeline export` prints, built from the manifest this export wrote."""
    out = tmp_path / "export"
    result = export(
        ExportConfig(model=LOOP, random_init=True, out_dir=out, formats=("torchscript", "pte"))
    )
    assert set(result.manifest.failed) == {"pte"} and "torchscript" in result.manifest.artifacts
    paragraph = partial_message(result.manifest, out)
    assert "model.pte (pte) was not written: ExecuTorch's runtime could not run" in paragraph
    assert "kernel failed" in paragraph and "it was not kept" in paragraph
    # The way out it names (ExecuTorch runs the loop at one planned size) works: below.
    assert "A .pte of one size may run: export it with --fix-axis seq=6 --fix-axis batch=3" in (
        paragraph
    )
    assert "Written and checked in" in paragraph and "(torchscript)" in paragraph
    assert not (out / "model.pte").exists()


def test_an_on_device_format_is_never_archived_deployed_or_served(
    exported: ExportResult, tmp_path: Path
) -> None:
    manifest = exported.manifest
    assert "pte" in manifest.artifacts and "pte" not in served.servable(manifest)
    with pytest.raises(ServeError, match="pte is an on-device format"):
        archive(
            ArchiveConfig(
                model="digits_lenet", export_dir=exported.out_dir, store=tmp_path, formats=("pte",)
            )
        )
    with pytest.raises(ServeError, match="on-device"):
        served_export(exported.out_dir, "pte")
    assert served.choose(manifest, {"format": "pte", "backend": "executorch"})[0] != "pte"
    assert not list(tmp_path.glob("*.mar"))
    proc = run_cli(
        "--artifacts-dir", tmp_path / "art", "deploy", "kserve", "--model", "digits_lenet",
        "--export-dir", exported.out_dir, "--format", "pte", "--out", tmp_path / "k8s",
        cwd=tmp_path,
    )  # fmt: skip
    assert_clean_error(proc, "on-device format")


def test_the_loop_at_one_size_verifies_in_both_runtimes(tmp_path: Path) -> None:
    """The way out the partial export names: every dynamic axis fixed (--fix-axis)."""
    fixed = export(
        ExportConfig(
            model=LOOP,
            random_init=True,
            out_dir=tmp_path / "export",
            formats=("pte",),
            fix_axes={"seq": 6, "batch": 3},
        )
    )
    record = fixed.manifest.artifact("pte")
    assert record.get("fixed_axes") == {"seq": 6, "batch": 3} and record.get("max_sizes") == {}
    report = verify(
        VerifyConfig(
            model=LOOP, export_dir=fixed.out_dir, with_cpp=True, report=tmp_path / "p.json"
        )
    )
    assert report.passed, report.failure_message()
    ran = {(r.backend, r.inputs) for r in report.rows}
    assert ("executorch", "golden") in ran and ("cpp/pte", "golden") in ran
    # the other sizes are listed as not run, not failed
    notes = [n for n in report.notes if n.startswith("executorch was compiled for")]
    assert len(notes) == 1 and "seq=6" in notes[0] and "batch=3" in notes[0], report.notes


# A convolution run in channels_last (its output's dim order is not row-major) and a
# bfloat16 input and output (numpy has none): the C++ runner used to write the first's
# bytes under the row-major shape (wrong numbers, exit 0) and crash on the second.
LAYOUTS_MODEL = """
import torch
from torch import nn


class Layouts(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, b):
        y = self.conv(x.contiguous(memory_format=torch.channels_last)) * 1.5
        return y, b * 2 + 1
"""


def test_a_channels_last_output_and_bfloat16_verify_in_the_cpp_runner(
    runner: Path, tmp_path: Path
) -> None:
    model = tmp_path / "layouts.py"
    model.write_text(LAYOUTS_MODEL)
    result = export(
        ExportConfig(
            model=f"{model}:Layouts",
            inputs=[parse_input("x:float32:batch,3,6,6"), parse_input("b:bfloat16:batch,4")],
            outputs=["y", "z"],
            random_init=True,
            out_dir=tmp_path / "export",
            formats=("pte",),
        )
    )
    report = verify(
        VerifyConfig(
            model=f"{model}:Layouts",
            export_dir=result.out_dir,
            with_cpp=True,
            pte_build_dir=runner.parent,
            report=tmp_path / "parity.json",
        )
    )
    assert report.passed, report.failure_message()
    cpp = {(r.inputs, r.output) for r in report.rows if r.backend == "cpp/pte"}
    assert ("golden", "y") in cpp and ("golden", "z") in cpp, cpp


def test_an_input_in_channels_last_is_handed_over_in_that_dim_order(
    runner: Path, tmp_path: Path
) -> None:
    """A program exported on a channels_last example reads its input in that dim order; the
    runner used to hand it the row-major .npy bytes as they lie (wrong numbers, exit 0)."""
    import torch

    from pipeline.formats import pte

    class Plus(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (torch.relu(x) + x).contiguous()

    x = torch.randn(2, 3, 4, 5)
    program = torch.export.export(Plus(), (x.contiguous(memory_format=torch.channels_last),))
    manager, _ = pte.lower(program, xnnpack=False)
    (tmp_path / "plus.pte").write_bytes(manager.buffer)
    (out,) = pte_runner.run(tmp_path / "plus.pte", [[x]], binary=runner).outputs
    assert torch.equal(out[0], Plus()(x))


def _run(runner: Path, model: Path, cases: dict[str, list], tmp_path: Path) -> tuple:
    """The runner by hand on `cases` ({folder: {file: array}}): (exit code, stderr, outputs)."""
    import numpy as np

    inputs, outputs = tmp_path / "in", tmp_path / "out"
    shutil.rmtree(inputs, ignore_errors=True)
    shutil.rmtree(outputs, ignore_errors=True)
    for folder, files in cases.items():
        (inputs / folder).mkdir(parents=True)
        for name, array in files.items():
            np.save(inputs / folder / name, array)
    cmd = [runner, "--model", model, "--inputs", inputs, "--outputs", outputs]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = {p.parent.name: np.load(p) for p in outputs.glob("*/0.npy")}
    return proc.returncode, proc.stderr, found


def test_the_runner_keeps_case_names_and_refuses_inputs_the_program_does_not_take(
    exported: ExportResult, runner: Path, tmp_path: Path
) -> None:
    import numpy as np

    model = exported.out_dir / "model.pte"
    a, b = (np.random.default_rng(s).random((2, 1, 28, 28), np.float32) for s in (0, 1))
    rc, err, out = _run(runner, model, {"3": {"0.npy": a}, "7": {"0.npy": b}}, tmp_path)
    assert rc == 0 and set(out) == {"3", "7"}, err  # not renamed 0/ and 1/
    alone = _run(runner, model, {"0": {"0.npy": b}}, tmp_path)[2]["0"]
    assert np.array_equal(out["7"], alone) and not np.array_equal(out["3"], alone)
    # A missing index is named (2.npy used to be taken as input 1); then every shape the
    # program does not take, exit 4 as for unreadable inputs: the fixed 28x28 too big or too
    # small, another rank, and another dtype.
    refused = {
        "has no 1.npy (it holds 2.npy)": {"0.npy": a, "2.npy": a},
        "has shape (2, 1, 29, 29); the program's input 0 takes (<=64, 1, 28, 28)": {
            "0.npy": np.zeros((2, 1, 29, 29), np.float32)
        },
        "has shape (2, 1, 27, 27)": {"0.npy": np.zeros((2, 1, 27, 27), np.float32)},
        "has shape (2, 784)": {"0.npy": np.zeros((2, 784), np.float32)},
        "has shape (65, 1, 28, 28)": {"0.npy": np.zeros((65, 1, 28, 28), np.float32)},
        "is <f8; the program's input 0 is Float": {"0.npy": a.astype(np.float64)},
    }
    for said, files in refused.items():
        rc, err, out = _run(runner, model, {"0": files}, tmp_path)
        assert rc == 4 and said in err and not out, (said, rc, err)
