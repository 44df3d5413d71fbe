"""Whom verify blames when a backend out of process fails: the artifact or its transport.

A served backend runs a file it was handed. Verify says the file "agrees in-process" only
when it has seen the file agree: an in-process backend of that format in the same check,
or, when none ran (a rollout's live check hands verify only the served backends), the
file as it is now, loaded and run in process on the inputs the served check failed on.
The backends out of process here run the real ONNX file in ONNX Runtime and hand the
answer back as a server would, once faithfully and once through a transport that
changes it; the end-to-end case, a live rollout of a tampered version, is in
test_rollout.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from pipeline.export import ExportResult
from pipeline.export.opened import open_export
from pipeline.verify import VerifyConfig, verify
from pipeline.verify.locate import ARTIFACT, TRANSPORT
from pipeline.zoo.spec import Inputs
from tests.tamper import alter_onnx_initializer, copy_export


class _Carried:
    """An out-of-process backend: the export's ONNX file, run by ONNX Runtime, its answer
    passed through `carry` (what a server and its wire do to it)."""

    in_process = False
    format_key = "onnx"

    def __init__(self, export_dir: Path, carry: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.name = "server/rest/onnx"
        self._runner = open_export(export_dir).load("onnx")
        self._carry = carry

    def run(self, inputs: Inputs) -> dict[str, torch.Tensor]:
        return {name: self._carry(t) for name, t in self._runner(inputs).items()}


def _served_only(export_dir: Path, backend: _Carried, tmp_path: Path) -> list[dict]:
    """Verify with the served backend alone, as the live check runs it."""
    report = verify(
        VerifyConfig(export_dir=export_dir, backends=("server",), served_names=("server",),
                     page=False, report=tmp_path / "report.json"),
        served=[backend],
    )  # fmt: skip
    assert not report.passed
    assert "Parity FAILED" in report.failure_message()
    return report.localisations


def test_a_changed_file_is_blamed_on_the_artifact_when_no_in_process_backend_ran(
    exported: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(exported, tmp_path / "export")
    alter_onnx_initializer(export_dir, "classifier.8.weight", lambda w: w * np.float32(1.5))
    (loc,) = _served_only(export_dir, _Carried(export_dir, lambda t: t), tmp_path)
    assert loc["blame"] == ARTIFACT, loc
    assert loc["artifact"] == str(export_dir / "model.onnx")
    assert "the onnx artifact itself differs from eager" in loc["line"], loc["line"]
    assert "classifier.8" in loc["line"]  # localised to the layer that was changed
    assert "transport" not in loc["line"]


def test_a_faithful_file_is_cleared_and_the_transport_blamed(
    exported: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(exported, tmp_path / "export")
    (loc,) = _served_only(export_dir, _Carried(export_dir, lambda t: t + 0.5), tmp_path)
    assert loc["blame"] == TRANSPORT, loc
    assert f"{export_dir / 'model.onnx'} as it is now, run in process" in loc["line"]


def test_agrees_in_process_is_said_from_a_check_that_ran(
    exported: ExportResult, tmp_path: Path
) -> None:
    export_dir = copy_export(exported, tmp_path / "export")
    report = verify(
        VerifyConfig(export_dir=export_dir, backends=("onnxruntime", "server"),
                     served_names=("server",), page=False, report=tmp_path / "report.json"),
        served=[_Carried(export_dir, lambda t: t * 2.0)],
    )  # fmt: skip
    (loc,) = report.localisations
    assert loc["blame"] == TRANSPORT
    assert "onnxruntime agrees with eager in this check" in loc["line"], loc["line"]
