"""Keep what can be made: a format that cannot express the model fails alone.

`torch.linalg.eigvals` has no ONNX conversion, while TorchScript and the
AOTInductor `.pt2` run it. The export writes and checks those two, records
ONNX as failed with the op named, prints one paragraph (no compiler IR dump)
and exits 3; verify and archive work on what exists. When nothing can be
written it is an ordinary failure: exit 1, and nothing replaces what was there.
"""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pipeline.core.errors import ArtifactError, ExportError
from pipeline.export import EXIT_PARTIAL, ExportConfig, export
from pipeline.export.opened import open_export
from pipeline.formats.explain import node_line
from pipeline.formats.onnx import missing_ops, python_name
from pipeline.runtimes.torchserve.archive import ArchiveConfig, ArchiveError, archive
from pipeline.verify import VerifyConfig, verify
from pipeline.zoo.user import parse_input
from pipeline_runtime.manifest import Manifest
from tests.conftest import run_cli

DATA = Path(__file__).parent / "data" / "partial_ops.py"
MODEL = f"{DATA}:EigenNet"
SLUG = "partial_ops_EigenNet"
INPUT = "x:float32:batch,9"
# What a compiler IR dump looks like: the TorchScript-based ONNX exporter prints
# "Torch IR graph at exception: graph(%x : Float(...), ...)" on every failure.
DUMP_MARKERS = ("Torch IR", "graph(%", "prim::Constant", "aten::linear")


@dataclass(frozen=True)
class Partial:
    art: Path
    proc: subprocess.CompletedProcess[str]

    @property
    def out_dir(self) -> Path:
        return self.art / SLUG / "export"


@pytest.fixture(scope="module")
def partial(tmp_path_factory: pytest.TempPathFactory) -> Partial:
    """EigenNet exported in every format from the command line, once for this module."""
    tmp = tmp_path_factory.mktemp("partial")
    art = tmp / "art"
    proc = run_cli(
        "--artifacts-dir", art, "export", "--model", MODEL, "--input", INPUT,
        "--random-init", "--format", "all", cwd=tmp,
    )  # fmt: skip
    return Partial(art, proc)


def test_the_formats_that_can_be_made_are_written_and_onnx_is_reported(partial: Partial) -> None:
    proc = partial.proc
    assert proc.returncode == EXIT_PARTIAL == 3, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for marker in DUMP_MARKERS:
        assert marker not in proc.stdout + proc.stderr, marker
    # One paragraph beside the progress lines, naming the op and what was written.
    messages = [ln for ln in proc.stderr.splitlines() if not ln.startswith("INFO ")]
    assert len(messages) == 1, proc.stderr
    paragraph = messages[0]
    assert paragraph.startswith(f"partial export of {MODEL}: model.onnx (onnx) was not written")
    assert "aten.linalg_eig" in paragraph and "torch.linalg.eigvals" in paragraph
    assert "partial_ops.py:20 (return torch.linalg.eigvals(m).abs())" in paragraph
    assert "model.torchscript.pt (torchscript), model.pt2 (pt2)" in paragraph
    assert "Exit status 3" in paragraph
    assert "model.torchscript.pt" in proc.stdout and "model.pt2" in proc.stdout

    manifest = Manifest.read(partial.out_dir)
    assert set(manifest.artifacts) == {"torchscript", "pt2", "golden", "probes", "warmup"}
    assert set(manifest.failed) == {"onnx", "pte"}
    assert "aten.linalg_eig" in manifest.failed["onnx"]
    assert "\n" not in manifest.failed["onnx"]
    # ExecuTorch cannot lower the op either, and says so naming the model's own line.
    assert "aten.linalg_eig.default is not in Core ATen opset" in manifest.failed["pte"]
    assert "partial_ops.py:20 (return torch.linalg.eigvals(m).abs())" in manifest.failed["pte"]
    # Only what the manifest lists is in the folder: no half-written model.onnx.
    assert sorted(p.name for p in partial.out_dir.iterdir()) == [
        "golden.pt",
        "manifest.json",
        "model.pt2",
        "model.torchscript.pt",
        "probes.pt",
        "warmup.npz",
    ]
    # The --random-init checkpoint was kept: the export points at it.
    assert (partial.art / SLUG / "checkpoint.pt").is_file()
    assert manifest.model.init == "random"


def test_verify_checks_the_formats_written(partial: Partial, tmp_path: Path) -> None:
    report = verify(
        VerifyConfig(model=MODEL, export_dir=partial.out_dir, report=tmp_path / "parity.json")
    )
    assert report.passed, report.failure_message()
    assert {r.backend for r in report.rows} == {"golden file", "torchscript", "pt2"}
    exported = open_export(partial.out_dir, model=MODEL)
    assert [f.key for f in exported.formats()] == ["torchscript", "pt2"]
    with pytest.raises(ArtifactError, match=r"no 'onnx' artifact: its export could not write it"):
        exported.path("onnx")


def test_archive_packs_only_the_formats_written(
    partial: Partial, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    with caplog.at_level(logging.WARNING, logger="pipeline.runtimes.torchserve.archive"):
        written = archive(ArchiveConfig(model=MODEL, export_dir=partial.out_dir, store=store))
    assert sorted(p.name for p in written) == [f"{SLUG}_pt2.mar", f"{SLUG}_ts.mar"]
    assert sorted(p.name for p in store.glob("*.mar")) == [f"{SLUG}_pt2.mar", f"{SLUG}_ts.mar"]
    assert "not archiving onnx: the export could not write it" in caplog.text
    with pytest.raises(ArchiveError, match=r"no onnx artifact: its export could not write it"):
        archive(
            ArchiveConfig(model=MODEL, export_dir=partial.out_dir, store=store, formats=("onnx",))
        )


def test_if_missing_does_not_retry_a_recorded_failure(partial: Partial, tmp_path: Path) -> None:
    before = (partial.out_dir / "manifest.json").read_bytes()
    common = ("--artifacts-dir", partial.art, "export", "--model", MODEL, "--input", INPUT)
    proc = run_cli(*common, "--format", "all", "--if-missing", cwd=tmp_path)
    assert proc.returncode == EXIT_PARTIAL, proc.stderr
    assert "already holds torchscript, pt2; nothing to do" in proc.stdout
    assert "onnx, pte failed at the last export" in proc.stderr
    assert "export without it to try again" in proc.stderr
    proc = run_cli(*common, "--format", "torchscript", "--if-missing", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (partial.out_dir / "manifest.json").read_bytes() == before  # nothing was redone


def test_a_total_failure_exits_1_and_replaces_nothing(tmp_path: Path) -> None:
    art = tmp_path / "art"
    common = ("--artifacts-dir", art, "export", "--model", MODEL, "--input", INPUT)
    proc = run_cli(*common, "--random-init", "--format", "onnx", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "error: ONNX has no conversion for aten.linalg_eig" in proc.stderr
    for marker in DUMP_MARKERS:
        assert marker not in proc.stdout + proc.stderr, marker
    assert not (art / SLUG).exists()  # no export, no checkpoint, no pending or empty folder

    # Over a good export and checkpoint (seed 0), a failed one (seed 1) changes nothing.
    proc = run_cli(*common, "--random-init", "--format", "torchscript", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    before = {p.name: p.read_bytes() for p in (art / SLUG).rglob("*") if p.is_file()}
    proc = run_cli(*common, "--random-init", "--seed", "1", "--format", "onnx", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    after = {p.name: p.read_bytes() for p in (art / SLUG).rglob("*") if p.is_file()}
    assert after == before


def test_every_format_failing_names_each(tmp_path: Path) -> None:
    """Several formats, all failing: one error naming each, nothing written."""
    with pytest.raises(ExportError, match=r"No format could be exported") as err:
        export(
            ExportConfig(
                model=f"{Path(__file__).parent / 'data' / 'user_gated.py'}:Unsplittable",
                inputs=[parse_input("x:float32:batch,4")],
                random_init=True,
                checkpoint=tmp_path / "ckpt" / "checkpoint.pt",
                out_dir=tmp_path / "export",
                formats=("torchscript", "onnx"),
            )
        )
    assert "TorchScript: No faithful TorchScript" in str(err.value)
    assert "ONNX: ONNX export failed" in str(err.value)
    assert not (tmp_path / "export").exists()
    assert not (tmp_path / "ckpt").exists()  # the folder it made for the checkpoint


def test_verbose_shows_what_torch_printed(tmp_path: Path) -> None:
    """The dump is kept from the user by default, not lost: `pipeline -v` logs it."""
    proc = run_cli(
        "-v", "--artifacts-dir", tmp_path / "art", "export", "--model", MODEL, "--input", INPUT,
        "--random-init", "--format", "onnx", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "torch.onnx.export (dynamo=False) printed:" in proc.stderr
    assert "Torch IR graph at exception" in proc.stderr


def test_the_op_names_and_the_models_line() -> None:
    dynamo = RuntimeError(
        "No ONNX function found for <OpOverload(op='aten.linalg_eig', overload='default')>."
    )
    legacy = RuntimeError(
        "Exporting the operator 'aten::linalg_eigvals' to ONNX opset version 18 is not supported"
    )
    assert missing_ops(dynamo, legacy, legacy) == ["aten.linalg_eig", "aten.linalg_eigvals"]
    assert missing_ops(RuntimeError("something else")) == []
    assert python_name("aten.linalg_eigvals") == "torch.linalg.eigvals"
    assert python_name("aten.fft_rfft") == "torch.fft.rfft"
    assert python_name("aten.cumsum") == "torch.cumsum"
    assert python_name("aten.no_such_op") is None
    trace = (
        f'File "{DATA}", line 20, in forward\n    return torch.linalg.eigvals(m).abs()\n'
        f'  File "{Path(torch.__file__).parent}/nn/functional.py", line 9, in f\n    x = 1'
    )
    line = node_line(trace) or ""
    assert line.endswith("partial_ops.py:20 (return torch.linalg.eigvals(m).abs())"), line
    assert node_line(None) is None


def test_if_missing_exports_again_when_the_weights_changed(tmp_path: Path) -> None:
    """--if-missing said "nothing to do" after a retrain, a new --seed or --weights FILE:
    it compared the model's name and formats only, and verify then passed the old weights."""
    art = tmp_path / "art"
    common = ("--artifacts-dir", art, "export", "--model", "my_cell", "--format", "torchscript")

    def sha() -> str:
        return json.loads((art / "my_cell" / "export" / "manifest.json").read_text())["checkpoint"][
            "sha256"
        ]

    assert run_cli(*common, "--random-init", cwd=tmp_path).returncode == 0
    first = sha()
    proc = run_cli(*common, "--random-init", "--if-missing", cwd=tmp_path)
    assert "nothing to do" in proc.stdout and sha() == first  # the same weights: skipped
    proc = run_cli(*common, "--random-init", "--seed", "1", "--if-missing", cwd=tmp_path)
    assert proc.returncode == 0 and "nothing to do" not in proc.stdout, proc.stdout
    assert sha() != first
    weights = tmp_path / "mine.pt"
    state = torch.load(art / "my_cell" / "checkpoint.pt", weights_only=True)
    torch.save({k: v + 1 for k, v in state.items()}, weights)
    second = sha()
    proc = run_cli(*common, "--weights", weights, "--if-missing", cwd=tmp_path)
    assert proc.returncode == 0 and "nothing to do" not in proc.stdout, proc.stdout
    assert sha() != second
    proc = run_cli(*common, "--if-missing", cwd=tmp_path)  # the imported checkpoint: settled
    assert "nothing to do" in proc.stdout, proc.stdout
