"""`.pt2` (torch.export + AOTInductor): every zoo model, both branches of the gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.errors import ExportError, PipelineError
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.verify import VerifyConfig, verify
from tests.conftest import FAMILY, run_cli

USER_FILE = Path(__file__).parent / "data" / "user_gated.py"


def _pt2_rows(report, backend: str = "pt2") -> set[str]:
    return {r.inputs for r in report.rows if r.backend == backend}


@pytest.mark.parametrize("name", ["digits_lenet", *FAMILY])
def test_every_model_exports_to_pt2_and_verifies(
    all_exports: dict[str, ExportResult], name: str, tmp_path: Path
) -> None:
    result = all_exports[name]
    art = result.manifest.to_json()["artifacts"]["pt2"]
    assert (result.out_dir / art["file"]).is_file()
    assert art["device"] == "cpu"
    if name == "digits_lenet":
        assert art["method"] == "torch.export"
    else:  # the gated family goes through its torch.cond formulation
        assert art["method"] == "torch.export (torch.cond formulation)"
        assert "rnn.py:" in art["reason"]
        assert "if x.sum() > 0" in art["reason"]
    report = verify(
        VerifyConfig(
            model=name, export_dir=result.out_dir, backends=("pt2",), report=tmp_path / "p.json"
        )
    )
    assert report.passed, report.failure_message()
    cases = _pt2_rows(report)
    assert "golden" in cases
    assert "random b=7" in cases  # the batch axis is dynamic
    if name != "digits_lenet":  # both branches of the gate
        assert any("+" in c or ">0" in c for c in cases)
        assert any("-" in c or "<0" in c for c in cases)
    if name in ("my_rnn_loop", "wrap_rnn"):  # and sequence lengths export never saw
        assert any("seq=13" in c for c in cases)
        assert "random seq=1" in cases and "random seq=18" in cases  # 1 and 3× the example's


def test_default_verify_includes_pt2(exported: ExportResult, tmp_path: Path) -> None:
    """Also at batch 33: a guard from the example batch (8) once capped the CNN's package at 15."""
    report = verify(
        VerifyConfig(
            model="digits_lenet",
            export_dir=exported.out_dir,
            batch_sizes=(1, 7, 33),
            report=tmp_path / "p.json",
        )
    )
    assert report.passed, report.failure_message()
    assert {r.backend for r in report.rows} >= {"torchscript", "onnxruntime", "pt2"}
    assert "random b=33" in _pt2_rows(report)


def test_digits_mlp_exports_to_pt2(tmp_path: Path) -> None:
    """The last zoo model, with seeded random weights (its training is tested elsewhere)."""
    result = export(
        ExportConfig(
            model="digits_mlp",
            checkpoint=tmp_path / "checkpoint.pt",
            out_dir=tmp_path / "export",
            formats=("pt2",),
            random_init=True,
        )
    )
    assert set(result.manifest.to_json()["artifacts"]) == {"pt2", "golden", "probes", "warmup"}
    report = verify(
        VerifyConfig(model="digits_mlp", export_dir=result.out_dir, report=tmp_path / "p.json")
    )
    assert report.passed, report.failure_message()
    assert {r.backend for r in report.rows} == {"golden file", "pt2"}


def test_a_tampered_pt2_is_refused(exported: ExportResult, tmp_path: Path) -> None:
    copy = tmp_path / "export"
    copy.mkdir()
    for f in exported.out_dir.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    data = bytearray((copy / "model.pt2").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "model.pt2").write_bytes(bytes(data))
    with pytest.raises(PipelineError, match="modified after export"):
        verify(
            VerifyConfig(
                model="digits_lenet",
                export_dir=copy,
                checkpoint=exported.out_dir / exported.manifest.checkpoint.path,
                backends=("pt2",),
                report=tmp_path / "p.json",
            )
        )


def test_a_users_gate_fails_torch_export_with_its_line_and_a_hint(tmp_path: Path) -> None:
    proc = run_cli(
        "--artifacts-dir", tmp_path / "art", "export", "--model", f"{USER_FILE}:TinyGated",
        "--input", "x:float32:batch,6", "--input", "scale:float32:1", "--output", "scores",
        "--random-init", "--format", "pt2", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "user_gated.py:13" in proc.stderr
    assert "if h.mean() > 0.5" in proc.stderr
    assert "torch.cond" in proc.stderr
    assert "Traceback" not in proc.stderr
    # Nothing was written: the export folder appears only when every format succeeded.
    assert not (tmp_path / "art" / "user_gated_TinyGated" / "export").exists()


def test_a_users_loop_over_a_dynamic_axis_is_explained(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="fixed the dynamic axis seq") as err:
        export(
            ExportConfig(
                model=f"{USER_FILE}:SeqLoop",
                checkpoint=tmp_path / "checkpoint.pt",
                out_dir=tmp_path / "export",
                formats=("pt2",),
                random_init=True,
                **_seq_spec(),
            )
        )
    assert "scan" in str(err.value)
    # What fixed it: the model's own loop, named by its line; and the way out.
    assert "user_gated.py:" in str(err.value) and "(for i in range(xs.size(0)):)" in str(err.value)
    assert "--fix-axis seq=N" in str(err.value)


def test_a_size_the_code_branches_on_bounds_the_package(tmp_path: Path) -> None:
    """torch.export can keep the batch axis only up to 64 (the model branches there, as CUDA's
    batch norm does at 65535): the package is compiled for that range, says so, and refuses
    a larger batch by name instead of failing the export as a "fixed" axis."""
    from pipeline.export.opened import open_export
    from pipeline.zoo.user import parse_input

    model = f"{USER_FILE}:BatchCapped"
    result = export(
        ExportConfig(
            model=model,
            checkpoint=tmp_path / "checkpoint.pt",
            out_dir=tmp_path / "export",
            formats=("pt2",),
            random_init=True,
            inputs=[parse_input("x:float32:batch,4")],
        )
    )
    art = result.manifest.to_json()["artifacts"]["pt2"]
    assert art["bounded_axes"] == {"batch": 64}
    assert "compiled for batch ≤ 64 only" in art["reason"]
    runner = open_export(result.out_dir).load("pt2", "cpu", 1)
    assert runner({"x": torch.randn(64, 4)})["output_0"].shape == (64, 4)
    with pytest.raises(RuntimeError, match="expected to be <= 64, but got: 65"):
        runner({"x": torch.randn(65, 4)})
    report = verify(  # batch 80 is past the bound: not run, and said
        VerifyConfig(
            model=model, export_dir=result.out_dir, backends=("pt2",), batch_sizes=(7, 80),
            report=tmp_path / "p.json",
        )
    )  # fmt: skip
    assert report.passed, report.failure_message()
    assert "random b=7" in _pt2_rows(report) and "random b=80" not in _pt2_rows(report)
    assert any("compiled for batch ≤ 64 only" in n and "random b=80" in n for n in report.notes)


def test_a_server_splits_stacked_requests_past_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stacked requests can hold more samples than the package takes: the KServe/Ray
    loader and TorchServe's handler run them in passes within the bound (bounded.py)."""
    from pipeline.export.opened import open_export
    from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
    from pipeline.serving import loading
    from pipeline.serving.wire import tensors_body
    from pipeline.zoo.user import parse_input
    from tests import ts_worker

    model = f"{USER_FILE}:BatchCapped"
    result = export(
        ExportConfig(
            model=model, checkpoint=tmp_path / "checkpoint.pt", out_dir=tmp_path / "export",
            formats=("pt2",), random_init=True, inputs=[parse_input("x:float32:batch,4")],
        )
    )  # fmt: skip
    x = torch.randn(150, 4)  # three passes: 64, 64, 22
    expected = open_export(result.out_dir).eager({"x": x})["output_0"].numpy()
    got = loading.load(result.out_dir, "pt2", 1, device="cpu").forward({"x": x.numpy()})
    np.testing.assert_allclose(got[0], expected, atol=1e-5, rtol=1e-5)
    (mar,) = archive(
        ArchiveConfig(model=model, export_dir=result.out_dir, store=tmp_path / "store")
    )
    service = ts_worker.load(mar, tmp_path / "tmp", monkeypatch)
    answers = ts_worker.infer(service, [tensors_body({"x": x[:90]}), tensors_body({"x": x[90:]})])
    assert [status for status, _ in answers] == [200, 200], answers
    served = np.concatenate([np.asarray(a["outputs"]["output_0"]) for _, a in answers])
    np.testing.assert_allclose(served, expected, atol=1e-5, rtol=1e-5)


def _seq_spec() -> dict:
    from pipeline.zoo.user import parse_input

    return {"inputs": [parse_input("xs:float32:seq,batch,4")]}


def test_users_gate_without_a_formulation_still_gets_onnx_from_the_legacy_exporter(
    tmp_path: Path,
) -> None:
    proc = run_cli(
        "--artifacts-dir", tmp_path / "art", "export", "--model", f"{USER_FILE}:TinyGated",
        "--input", "x:float32:batch,6", "--input", "scale:float32:1", "--output", "scores",
        "--random-init", "--format", "onnx", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(
        (tmp_path / "art" / "user_gated_TinyGated" / "export" / "manifest.json").read_text()
    )
    assert set(manifest["artifacts"]) == {"onnx", "golden", "probes", "warmup"}
    assert manifest["artifacts"]["onnx"]["exporter"] == "torchscript (dynamo=False)"

    # When torch refuses torch.jit (issue 42) that way out is gone: the failure says what to
    # write instead (torch.cond), and not to script the model.
    refused = run_cli(
        "--artifacts-dir", tmp_path / "refused", "export", "--model", f"{USER_FILE}:TinyGated",
        "--input", "x:float32:batch,6", "--input", "scale:float32:1", "--output", "scores",
        "--random-init", "--format", "onnx", cwd=tmp_path,
        env={"PYTHONPATH": str(Path(__file__).parents[1] / "jit_refused")},
    )  # fmt: skip
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "torch.cond(pred, true_fn, false_fn" in refused.stderr, refused.stderr
    assert "the other way to ONNX, cannot run: this torch refuses" in refused.stderr
    assert "--format torchscript/onnx, which script it" not in refused.stderr


def test_cond_formulation_is_what_the_package_runs(family: dict[str, ExportResult]) -> None:
    """The package answers like eager on inputs chosen here, not only on the stored probes."""
    from pipeline.core.compare import flatten_outputs
    from pipeline.formats.pt2 import load_package
    from pipeline.zoo import get_entry

    result = family["wrap_rnn"]
    entry = get_entry("wrap_rnn")
    model = entry.build()
    ckpt = result.out_dir / result.manifest.checkpoint.path
    model.load_state_dict(torch.load(ckpt, weights_only=True))
    model.eval()
    runner = load_package(result.out_dir / "model.pt2")
    gen = torch.Generator().manual_seed(5)
    for seq, batch in [(1, 1), (2, 9), (20, 3)]:
        xs = torch.randn(seq, batch, 4, generator=gen) * 4
        for sign in (1, -1):
            with torch.no_grad():
                (got,) = flatten_outputs(runner(sign * xs))
                torch.testing.assert_close(got, model(sign * xs))


def test_the_package_checks_its_inputs_and_takes_a_batch_of_one(
    family: dict[str, ExportResult],
) -> None:
    """AOTInductor's code trusts its inputs unless asked to check them; load_package asks."""
    from pipeline.formats.pt2 import load_package

    runner = load_package(family["my_cell"].out_dir / "model.pt2")
    one = torch.randn(1, 4)
    assert len(runner(one, one)) == 2  # batch 1 passes the check (lower bound 1, not 2)
    for x, h in [
        (torch.randn(3, 4), torch.randn(2, 4)),  # disagreeing batch sizes
        (torch.randn(3, 5), torch.randn(3, 4)),  # a wrong feature size
        (torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4)),  # a wrong dtype
    ]:
        with pytest.raises(RuntimeError):
            runner(x, h)
