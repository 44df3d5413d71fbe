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
        (["--warmup", "abc"], "--warmup must be 0 or more"),  # atoi read 0
        (["--repeat", "-5"], "--repeat must be at least 1"),  # clamped to 1 unsaid
    ],
)
def test_the_runner_names_a_bad_flag(runner: Path, extra: list[str], said: str) -> None:
    proc = subprocess.run(
        [runner, "--model", "m.pte", "--inputs", "in", *extra], capture_output=True, text=True
    )
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr


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
