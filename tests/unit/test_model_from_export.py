"""--model left out of a command that takes --export-dir: the model the folder holds
(pipeline.core.cliargs.resolve_model). Before, it was always the default model, so
`pipeline verify --export-dir DIR` of any other model was refused ("holds an export of
'lstm_tagger', not 'digits_lenet'") until --model repeated what the folder says."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import build_parser
from pipeline.core.defaults import DEFAULT_MODEL
from pipeline_runtime.manifest import (
    MANIFEST_NAME,
    CheckpointRef,
    Manifest,
    ModelRecord,
    TensorRecord,
    Tolerance,
)


def _export(folder: Path, model: str) -> Path:
    manifest = Manifest(
        model=ModelRecord(model),
        inputs=(TensorRecord("tokens", ("batch", "seq"), "int64"),),
        outputs=(TensorRecord("tag_logits", ("batch", "seq", 5), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("../checkpoint.pt", "0" * 64),
        artifacts={},
        created="2026-11-29T00:00:00+00:00",
    )
    folder.mkdir(parents=True)
    (folder / MANIFEST_NAME).write_text(manifest.dumps())
    return folder


def _model(*argv: str) -> str:
    return build_parser().parse_args(argv).model


@pytest.mark.parametrize(
    "command",
    [("verify",), ("publish",), ("archive",), ("deploy", "kserve", "--out", "o"),
     ("deploy", "ray", "--out", "o")],
    ids=["verify", "publish", "archive", "deploy-kserve", "deploy-ray"],
)  # fmt: skip
def test_the_export_dir_names_the_model(tmp_path: Path, command: tuple[str, ...]) -> None:
    export = _export(tmp_path / "export", "lstm_tagger")
    assert _model(*command, "--export-dir", str(export)) == "lstm_tagger"
    # Given, --model stays what was typed (open_export then checks that it matches).
    assert _model(*command, "--export-dir", str(export), "--model", "digits_mlp") == "digits_mlp"
    # No --export-dir, or one without a manifest: the default model, as before.
    assert _model(*command) == DEFAULT_MODEL
    assert _model(*command, "--export-dir", str(tmp_path / "nothing")) == DEFAULT_MODEL


def test_commands_without_an_export_dir_keep_their_model_defaults() -> None:
    assert _model("export") == DEFAULT_MODEL
    assert _model("where") == DEFAULT_MODEL
    assert (
        build_parser().parse_args(["bench"]).model is None
    )  # bench's own default: its list of models


def test_an_export_moved_without_its_checkpoint_says_so(tmp_path: Path) -> None:
    # It said "Train one with `pipeline train`", of a checkpoint that exists elsewhere.
    from pipeline.core.errors import ArtifactError
    from pipeline.export.opened import open_export

    export = _export(tmp_path / "copied" / "export", "lstm_tagger")
    with pytest.raises(ArtifactError) as err:
        open_export(export)
    said = str(err.value)
    assert "exported from the checkpoint '../checkpoint.pt'" in said, said
    assert str(tmp_path / "copied" / "checkpoint.pt") in said and "--checkpoint PATH" in said
    assert "pipeline train" not in said
