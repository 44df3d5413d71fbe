"""Each way a checkpoint can be wrong gets a clear refusal, and nothing runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from pipeline.core.checkpoint import load_checkpoint, save_checkpoint, sidecar_path
from pipeline.core.errors import CheckpointError
from pipeline.core.fileio import sha256_file

META = {"model": {"name": "digits_lenet", "kwargs": {}}, "seed": 0, "epochs": 1, "metrics": {}}


def _fake_checkpoint(path: Path, payload: object) -> Path:
    """A .pt holding `payload` with a sidecar whose sha256 matches it, so the
    loader's later checks (not the hash) are what is exercised."""
    torch.save(payload, path)
    save_meta = {
        **META,
        "format": "pipeline.core.checkpoint/1",
        "weights_sha256": sha256_file(path),
    }
    sidecar_path(path).write_text(json.dumps(save_meta))
    return path


def test_round_trip_and_sidecar(tmp_path: Path) -> None:
    sd = {"w": torch.randn(3, 3), "b": torch.zeros(3)}
    ckpt = save_checkpoint(tmp_path / "c.pt", sd, META)
    meta = json.loads(sidecar_path(ckpt.path).read_text())
    assert meta["weights_sha256"] == sha256_file(ckpt.path)
    assert meta["torch_version"] == torch.__version__
    loaded = load_checkpoint(ckpt.path)
    assert loaded.model_name == "digits_lenet"
    assert torch.equal(loaded.state_dict["w"], sd["w"])
    # Plain torch.load with weights_only=True reads it too (the DESIGN contract).
    assert set(torch.load(ckpt.path, weights_only=True)) == {"w", "b"}


def test_same_tensors_give_same_bytes_whatever_the_file_name(tmp_path: Path) -> None:
    sd = {"w": torch.arange(6.0)}
    a = save_checkpoint(tmp_path / "a.pt", sd, META)
    b = save_checkpoint(tmp_path / "sub" / "b.pt", sd, META)
    assert a.meta["weights_sha256"] == b.meta["weights_sha256"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"does not exist.*pipeline train") as err:
        load_checkpoint(tmp_path / "nope.pt")
    assert "nope.pt" in str(err.value)


def test_missing_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"w": torch.zeros(1)}, path)
    with pytest.raises(CheckpointError, match=r"metadata file .*c\.json is missing"):
        load_checkpoint(path)


def test_sha256_mismatch(tmp_path: Path) -> None:
    ckpt = save_checkpoint(tmp_path / "c.pt", {"w": torch.zeros(4)}, META)
    data = bytearray(ckpt.path.read_bytes())
    data[-30] ^= 0xFF
    ckpt.path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"sha256 is [0-9a-f]{64} but its metadata records"):
        load_checkpoint(ckpt.path)


def test_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "notes.pt"
    path.write_bytes(os.urandom(2048))
    sidecar_path(path).write_text(
        json.dumps(
            {**META, "format": "pipeline.core.checkpoint/1", "weights_sha256": sha256_file(path)}
        )
    )
    with pytest.raises(CheckpointError, match=r"notes\.pt: it is not a PyTorch checkpoint"):
        load_checkpoint(path)


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    _fake_checkpoint(path, {"w": torch.zeros(100)})
    path.write_bytes(path.read_bytes()[:200])
    sidecar_path(path).write_text(
        json.dumps(
            {**META, "format": "pipeline.core.checkpoint/1", "weights_sha256": sha256_file(path)}
        )
    )
    with pytest.raises(CheckpointError, match="not"):
        load_checkpoint(path)


def test_corrupt_sidecar(tmp_path: Path) -> None:
    ckpt = save_checkpoint(tmp_path / "c.pt", {"w": torch.zeros(1)}, META)
    sidecar_path(ckpt.path).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(ckpt.path)


class _RunsACommand:
    """Unpickling this calls os.system: the classic malicious checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = _fake_checkpoint(tmp_path / "evil.pt", {"w": torch.zeros(1), "x": _RunsACommand(marker)})
    with pytest.raises(
        CheckpointError, match=r"pickled objects beyond tensors.*(GLOBAL|system)"
    ) as err:
        load_checkpoint(path)
    assert "evil.pt" in str(err.value)
    assert not marker.exists()


def test_whole_model_instead_of_state_dict_is_refused(tmp_path: Path) -> None:
    path = _fake_checkpoint(tmp_path / "model.pt", torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match="pickled objects beyond tensors") as err:
        load_checkpoint(path)
    # The advice fits a user's own model too, which `pipeline train` does not train.
    assert "Save only `model.state_dict()` with `torch.save`" in str(err.value)
    assert "pipeline train" not in str(err.value)


def test_bare_tensor_is_not_a_state_dict(tmp_path: Path) -> None:
    path = _fake_checkpoint(tmp_path / "t.pt", torch.zeros(3))
    with pytest.raises(CheckpointError, match="holds a Tensor, not a state_dict"):
        load_checkpoint(path)
