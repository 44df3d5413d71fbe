"""Issue 42: what the pipeline does when torch refuses `torch.jit` (PyTorch PR #189705),
in process: torch.jit.load is replaced by a stand-in raising the PR's RuntimeError, and
jitgate's answer (cached per process) is cleared around each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipeline.core.errors import ExportError
from pipeline.formats import base as registry
from pipeline.formats.explain import COND_HINT, COND_SCRIPT_HINT, cond_hint
from pipeline.formats.torchscript import to_torchscript
from pipeline.serving.served import choose, preferred_format
from pipeline_runtime import jitgate, runners
from pipeline_runtime.manifest import ArtifactRecord
from tests.manifests import digits_manifest

REFUSAL = "`torch.jit.load` is deprecated. Please switch to `torch.export`."


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    jitgate.refused.cache_clear()
    yield
    jitgate.refused.cache_clear()


@pytest.fixture
def refusing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(REFUSAL)

    for name in ("load", "script", "trace"):
        monkeypatch.setattr(torch.jit, name, refuse)


def test_this_torch_runs_torch_jit() -> None:
    assert jitgate.refused() == ""
    assert cond_hint().endswith(COND_SCRIPT_HINT)
    assert preferred_format(["onnx", "torchscript", "pt2"]) == "torchscript"


@pytest.mark.usefixtures("refusing")
def test_a_refusal_is_found_and_told_apart_from_torchscript_errors() -> None:
    assert jitgate.refused() == REFUSAL
    assert jitgate.is_refusal(RuntimeError(REFUSAL))
    assert jitgate.is_refusal(RuntimeError("`torch.jit.script` is not supported in Python 3.14+"))
    assert not jitgate.is_refusal(RuntimeError("undefined value torch"))
    assert not jitgate.is_refusal(ValueError(REFUSAL))
    message = jitgate.refusal_message("TorchScript cannot be written")
    assert REFUSAL in message and "torch==2.14.1" in message and jitgate.ESCAPE_VALUE in message


def test_the_defaults_and_all_leave_torchscript_out_and_pt2_takes_its_place() -> None:
    defaults, every = registry.default_keys(), registry.full_precision_keys()
    assert "torchscript" in defaults and "pt2" not in defaults  # this torch's
    assert registry.without_jit(defaults, defaults=True) == ("onnx", "pt2")
    assert registry.without_jit(every) == tuple(k for k in every if k != "torchscript")
    assert registry.without_jit(("onnx",), defaults=True) == ("onnx",)  # nothing left out


@pytest.mark.usefixtures("refusing")
def test_serve_load_and_export_under_the_refusal(caplog: pytest.LogCaptureFixture) -> None:
    assert preferred_format(["onnx", "torchscript", "pt2"]) == "onnx"
    assert preferred_format(["torchscript"]) == "torchscript"  # the only one: its load says why
    # serve's reason said "the first format held in registry order (onnx, float32)" of an
    # export holding TorchScript first: now it says why TorchScript was passed over.
    held = {k: ArtifactRecord(f"model.{k}", k, "a") for k in ("torchscript", "onnx")}
    assert choose(digits_manifest(held), None)[1].endswith(
        "(onnx, float32, torchscript passed over: this torch refuses torch.jit)"
    )
    assert cond_hint() == COND_HINT  # scripting is no way out any more
    with pytest.raises(runners.LoadError, match="cannot be loaded: this torch refuses"):
        runners.load("torchscript", Path("model.torchscript.pt"), inputs=["x"], outputs=["y"])
    model = torch.nn.Linear(2, 2).eval()
    with pytest.raises(ExportError, match="TorchScript cannot be written: this torch refuses"):
        to_torchscript(model, {"x": torch.ones(1, 2)}, [])
    jitgate._said.discard("rehearsal")
    for _ in range(2):
        jitgate.say_once(jitgate.logging.getLogger("test"), "rehearsal")
    assert [r.getMessage().count("refuses torch.jit") for r in caplog.records] == [1]
