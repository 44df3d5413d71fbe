"""What verify tells a user to run when a backend's format is missing from the export."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import ArtifactError
from pipeline.export import ExportConfig, export
from pipeline.export.opened import open_export
from pipeline.train import TrainConfig, train
from pipeline.verify.backends import load_backends


def test_a_missing_format_is_re_exported_with_every_format_the_folder_holds(
    tmp_path: Path,
) -> None:
    # "re-run `pipeline export --format pte_int8`": run as said, it replaced the folder
    # and deleted the model.pte beside it (a user's trial of the on-device format).
    checkpoint = tmp_path / "ck.pt"
    train(TrainConfig(model="my_decision_gate", out=checkpoint, progress=False, report=False))
    out = tmp_path / "export"
    config = ExportConfig(
        model="my_decision_gate", checkpoint=checkpoint, out_dir=out, formats=("torchscript",)
    )
    export(config)
    with pytest.raises(ArtifactError) as err:
        load_backends("onnxruntime", open_export(out))
    assert "re-run `pipeline export --format torchscript --format onnx`" in str(err.value)
