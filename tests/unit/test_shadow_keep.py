"""The shadow check keeps up to KEEP_MAX divergent samples per run folder. Each sample is
three files (inputs .npz, answers .npz, .json); counting every .npz stopped it at half."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.serving import shadowref
from pipeline_runtime.shadowwire import Sample


def test_keep_stops_at_keep_max_samples_not_at_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shadowref, "_manifest_model", lambda export_dir: "digits_lenet")
    sample = Sample(
        "digits_lenet",
        1,
        "onnx",
        str(tmp_path / "export"),
        {"image": np.zeros((1, 1, 28, 28), np.float32)},
        [np.zeros((1, 10), np.float32)],
    )
    kept = [
        shadowref.keep(tmp_path, sample, [np.ones((1, 10), np.float32)], "diverged")
        for _ in range(shadowref.KEEP_MAX + 3)
    ]
    assert all(kept[: shadowref.KEEP_MAX]) and not any(kept[shadowref.KEEP_MAX :]), kept
    folder = tmp_path / shadowref.SHADOW_DIR
    assert len(list(folder.glob("*.answers.npz"))) == shadowref.KEEP_MAX
    # A replay's report lands beside the samples: it takes no sample's place.
    for path in list(folder.glob("*.answers.npz"))[:3]:
        path.unlink()
        Path(str(path).replace(".answers.npz", ".parity.json")).write_text("{}")
    assert shadowref.keep(tmp_path, sample, [np.ones((1, 10), np.float32)], "diverged")
    replay = np.load(kept[0])  # the inputs alone, as verify --inputs reads them
    assert list(replay) == ["image"]


def test_the_same_inf_as_eager_is_no_divergence_another_is() -> None:
    """A finite input that overflows the model answers Inf in eager and served alike: the
    shadow check counted it as the artifact diverging (and the replay blamed the file)."""
    from types import SimpleNamespace

    manifest = SimpleNamespace(
        output_names=["logits"], tolerance=SimpleNamespace(atol=1e-5, rtol=1e-4)
    )
    eager = [np.array([[np.inf, -np.inf, 1.0]], dtype=np.float32)]
    share, _ = shadowref._elementwise(manifest, eager, [eager[0].copy()])
    assert share == 0.0
    share, _ = shadowref._elementwise(manifest, eager, [eager[0] + [0, 0, 1]])
    assert share > 1.0  # the finite element still compared
    for served in ([[np.inf, np.nan, 1.0]], [[np.inf, 0.0, 1.0]], [[1.0, 2.0, 3.0]]):
        share, said = shadowref._elementwise(manifest, eager, [np.array(served, np.float32)])
        assert share == math.inf and "is NaN or Inf where eager's is not, or the reverse" in said, (
            served
        )
