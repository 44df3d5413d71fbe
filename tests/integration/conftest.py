"""Integration fixtures beyond tests/conftest.py's: the recurrent models' exports, a
detector's, and a module's OTLP trace receiver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.core.paths import model_slug
from tests.conftest import SERVED_FORMATS, run_cli, shared

if TYPE_CHECKING:  # imported where used: a GPU machine's own Python may lack OpenTelemetry
    from tests import otlp

# The two recurrent models of issue 30, exported as a user does from the command line:
# the tagger as a user's class with its inputs declared (the issue's own words), the
# encoder by its zoo name. Both have a dynamic sequence axis.
RECURRENT: dict[str, tuple[str, tuple[str, ...]]] = {
    "lstm_tagger": (
        "pipeline.zoo.recurrent:LstmTagger",
        ("--input", "tokens:int64:batch,seq:0:1000", "--output", "tag_logits"),
    ),
    "gru_encoder": ("gru_encoder", ()),
}


@pytest.fixture(scope="session")
def recurrent(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """name → {model, export_dir, returncode, stdout, stderr} of `pipeline export --random-init`
    in every served float32 format (the .pt2 through the scan formulation). Not the .pte:
    ExecuTorch 1.5.1 runs a loop only at its planned sizes, which test_pte.py shows once."""
    formats = [a for k in SERVED_FORMATS for a in ("--format", k)]

    def make(root: Path) -> dict[str, dict[str, Any]]:
        out = {}
        for name, (model, flags) in RECURRENT.items():
            proc = run_cli(
                "--artifacts-dir", root, "export", "--model", model, *flags,
                "--random-init", *formats, cwd=root,
            )  # fmt: skip
            out[name] = {
                "model": model,
                "export_dir": str(root / model_slug(model) / "export"),
                "returncode": proc.returncode,
                "stdout": proc.stdout,
                "stderr": proc.stderr,
            }
        return out

    return shared(tmp_path_factory, "recurrent", make)


# torchvision detectors (issues 36 and 49), exported as a user does: by their torchvision
# names at their default settings (91 classes; SSDlite keeps up to 300 detections per
# image, Faster R-CNN 100), with random weights (no download) whose class scores
# --random-init spreads, in the two formats a detector goes to (torch.export stops on
# NMS's data-dependent sizes: .pt2 is refused with the reason, tested in
# test_detection.py). A one-stage family and a two-stage one, both at 320×320.
DETECTOR = "torchvision:ssdlite320_mobilenet_v3_large"
TWO_STAGE = "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn"
# The random batches the detectors' verifies draw: 2 rather than verify's default 7 beside
# 1, since what is under test is a batch of more than one image (TorchScript takes any,
# ONNX's trace fixed 1), not its size; seven images through each backend were most of a
# detector's verify.
DETECTOR_BATCHES = (1, 2)


def _export_detector(root: Path, model: str) -> dict[str, Any]:
    proc = run_cli(
        "--artifacts-dir", root, "export", "--model", model, "--random-init",
        "--format", "torchscript", "--format", "onnx", cwd=root,
    )  # fmt: skip
    return {
        "model": model,
        "export_dir": str(root / model_slug(model) / "export"),
        "returncode": proc.returncode,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


@pytest.fixture(scope="session")
def detector(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{model, export_dir, returncode, stdout, stderr} of SSDlite's CLI export."""
    return shared(tmp_path_factory, "detector", lambda root: _export_detector(root, DETECTOR))


@pytest.fixture(scope="session")
def two_stage(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same for Faster R-CNN (MobileNetV3 320): region proposals, then a box head."""
    return shared(tmp_path_factory, "two_stage", lambda root: _export_detector(root, TWO_STAGE))


@pytest.fixture(scope="module")
def receiver() -> Iterator[otlp.Receiver]:
    """A real OTLP/HTTP trace receiver on 127.0.0.1 for one module's server (tests/otlp.py)."""
    from tests import otlp

    found = otlp.start()
    try:
        yield found
    finally:
        found.close()
