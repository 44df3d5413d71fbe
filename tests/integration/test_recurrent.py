"""When a recurrent layer cannot be rewritten as `scan`: the .pt2 fails naming what fixed the
sequence axis and the way out, `--fix-axis AXIS=N`, which compiles the .pt2 for one length
that verify and the servers then hold it to (docs/export.md, "Recurrent layers")."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import torch

from pipeline.core.paths import model_slug
from pipeline.export.opened import open_export
from pipeline.runtimes.kserve.config import RuntimeConfig
from pipeline.runtimes.kserve.launch import served_export, start
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import INFERENCE_KEY_FILE
from pipeline.verify import VerifyConfig, verify
from tests.conftest import assert_clean_error, run_cli

USER_FILE = Path(__file__).parent / "data" / "user_recurrent.py"
FRAMES = ("--input", "x:float32:batch,seq,8")


def test_a_layer_kept_as_it_is_fails_the_pt2_naming_it_and_the_option(tmp_path: Path) -> None:
    proc = run_cli(
        "--artifacts-dir", tmp_path, "export", "--model", f"{USER_FILE}:NormedTagger", *FRAMES,
        "--random-init", "--format", "pt2", cwd=tmp_path,
    )  # fmt: skip
    assert_clean_error(
        proc,
        "the code fixed the dynamic axis seq",
        "torch's own nn.LSTM fixed `seq`",
        "rnn: NormedLSTM(8, 8, batch_first=True) was kept as it is",
        "NormedLSTM has its own forward",
        "--fix-axis seq=N",
    )
    assert not (tmp_path / model_slug(f"{USER_FILE}:NormedTagger") / "export").exists()


def test_a_bad_fix_axis_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    for flag, message in (
        ("seq", "write AXIS=N"),  # the form is checked first (tests/unit: parse_fix_axes)
        ("time=4", "has no such dynamic axis; its dynamic axes are batch, seq"),
    ):
        proc = run_cli(
            "--artifacts-dir", tmp_path, "export", "--model", f"{USER_FILE}:LoopRNN", *FRAMES,
            "--random-init", "--format", "pt2", "--fix-axis", flag, cwd=tmp_path,
        )  # fmt: skip
        assert_clean_error(proc, message)
        assert not (tmp_path / model_slug(f"{USER_FILE}:LoopRNN")).exists()


def test_fix_axis_compiles_the_pt2_for_one_length_that_verify_and_serving_hold_it_to(
    tmp_path: Path,
) -> None:
    model = f"{USER_FILE}:LoopRNN"
    proc = run_cli(
        "--artifacts-dir", tmp_path, "export", "--model", model, *FRAMES, "--random-init",
        "--format", "onnx", "--format", "pt2", "--fix-axis", "seq=6", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "compiled for seq=6 only (--fix-axis)" in proc.stdout
    export_dir = tmp_path / model_slug(model) / "export"
    opened = open_export(export_dir)
    assert opened.manifest.artifact("pt2").get("fixed_axes") == {"seq": 6}
    assert "fixed_axes" not in opened.manifest.artifact("onnx").details  # the others stay dynamic

    report = verify(VerifyConfig(model=model, export_dir=export_dir, report=tmp_path / "p.json"))
    assert report.passed, report.failure_message()
    pt2_rows = {r.inputs for r in report.rows if r.backend == "pt2"}
    assert pt2_rows == {"random seq=6 (a fixed axis)"}
    onnx_rows = {r.inputs for r in report.rows if r.backend == "onnxruntime"}
    assert {"random seq=1", "random seq=15", "random seq=6 (a fixed axis)"} <= onnx_rows
    assert any(
        "pt2 was compiled for seq=6 only (a fixed axis: --fix-axis" in n for n in report.notes
    )

    config = RuntimeConfig(
        models=[served_export(export_dir, "pt2", name="loop_pt2")],
        http_port=free_port(),
        grpc_port=free_port(),
    )
    run_dir = tmp_path / "run"
    server = start(config, run_dir)
    try:
        key = json.loads((run_dir / INFERENCE_KEY_FILE).read_text())["inference"]["key"]
        url = f"{server.inference_url}/v2/models/loop_pt2/infer"
        auth = {"Authorization": f"Bearer {key}"}

        def ask(length: int) -> httpx.Response:
            x = torch.randn(2, length, 8, generator=torch.Generator().manual_seed(length))
            tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32",
                      "data": x.flatten().tolist()}  # fmt: skip
            return httpx.post(url, json={"inputs": [tensor]}, headers=auth, timeout=30)

        refused = ask(5)
        assert refused.status_code == 400, refused.text
        assert "6" in refused.json()["error"], refused.text  # the shape it takes
        answered = ask(6)
        assert answered.status_code == 200, answered.text
        x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(6))
        got = torch.tensor(answered.json()["outputs"][0]["data"]).reshape(2, 8)
        torch.testing.assert_close(got, opened.eager({"x": x})["output_0"], atol=1e-4, rtol=1e-3)
    finally:
        stop(run_dir)
