"""`--calibration FILE`: the two file kinds read, and every misfit refused with its reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.errors import InputSpecError
from pipeline.export import calibration
from pipeline.zoo import get_entry

ENTRY = get_entry("digits_lenet")  # image: (batch, 1, 28, 28) float32


def _save(path: Path, data: object) -> Path:
    torch.save(data, path)
    return path


def test_a_list_of_input_dicts_is_read_batch_by_batch(tmp_path: Path) -> None:
    batches = [{"image": torch.rand(4, 1, 28, 28)}, {"image": torch.rand(2, 1, 28, 28)}]
    cal = calibration.load_file(_save(tmp_path / "cal.pt", batches), ENTRY)
    assert cal.source == "file" and not cal.synthetic
    assert [b["image"].shape[0] for b in cal.batches] == [4, 2]
    assert cal.record() == {"source": "file", "what": "cal.pt: 2 batches, 6 samples",
                            "batches": 2, "samples": 6}  # fmt: skip


def test_an_npz_is_split_into_batches(tmp_path: Path) -> None:
    path = tmp_path / "cal.npz"
    np.savez(path, image=np.random.rand(70, 1, 28, 28).astype(np.float32))
    cal = calibration.load_file(path, ENTRY)
    assert [b["image"].shape[0] for b in cal.batches] == [32, 32, 6]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([{"image": torch.rand(4, 1, 32, 32)}], "must have shape (batch, 1, 28, 28), got (4, 1, 32, 32)"),
        ([{"image": torch.rand(4, 1, 28, 28, dtype=torch.float64)}], "must be float32, got float64"),
        ([{"pixels": torch.rand(4, 1, 28, 28)}], "batch 0 has inputs ['pixels'], not ['image']"),
        ([{"image": torch.rand(2, 1, 28, 28)}, "oops"], "item 1 is a str"),
        ([], "not a non-empty list of dicts"),
    ],
)  # fmt: skip
def test_a_file_that_does_not_fit_the_inputs_is_refused(
    tmp_path: Path, data: object, fragment: str
) -> None:
    path = _save(tmp_path / "cal.pt", data)
    with pytest.raises(InputSpecError) as err:
        calibration.load_file(path, ENTRY)
    assert fragment in str(err.value) and str(path) in str(err.value)
    assert "image(batch, 1, 28, 28):float32" in str(err.value)  # what it must hold instead


def test_an_npz_with_other_names_or_a_pickle_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros((3, 1, 28, 28), np.float32))
    with pytest.raises(InputSpecError, match=r"holds arrays \['x'\], not \['image'\]"):
        calibration.load_file(tmp_path / "a.npz", ENTRY)
    (tmp_path / "b.pt").write_bytes(b"not a torch file")
    with pytest.raises(InputSpecError, match=r"cannot be loaded with torch\.load"):
        calibration.load_file(tmp_path / "b.pt", ENTRY)
    with pytest.raises(InputSpecError, match="does not exist"):
        calibration.load_file(tmp_path / "missing.pt", ENTRY)


def test_the_zoo_calibration_split_is_training_data_and_synthetic_is_marked() -> None:
    cal = calibration.calibration_for(ENTRY, None)
    assert cal.source == "zoo" and cal.samples == calibration.CALIBRATION_SAMPLES
    assert "training split" in cal.what
    made = calibration.synthetic(ENTRY)
    assert made.synthetic and made.record()["synthetic"] is True
