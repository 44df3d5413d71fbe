"""A .pt2 compiled with a named axis bounded (torch.export kept `seq` only up to 64: the
model slices a 64-row table) failed past it with a 500 ("dim value is too large"). Every
runtime now refuses such a request with a 400 naming the axis and its bound, from the
manifest (pipeline_runtime.bounded.axis_bounds, request.Limits.max_axes); the batch axis
is split into passes instead (bounded.within_bound), not refused."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline_runtime import bounded, codec
from pipeline_runtime.manifest import (
    ArtifactRecord,
    CheckpointRef,
    Manifest,
    ModelRecord,
    TensorRecord,
    Tolerance,
)

IDS = TensorRecord("ids", ("batch", "seq"), "int64", low=0, high=50)


def _manifest(bounds: dict[str, int]) -> Manifest:
    pt2 = ArtifactRecord("model.pt2", "aotinductor", "0" * 64, details={"bounded_axes": bounds})
    return Manifest(
        model=ModelRecord("mine.py:TinyTransformer"),
        inputs=(IDS,),
        outputs=(TensorRecord("logits", ("batch", 4), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("../checkpoint.pt", "0" * 64),
        artifacts={"pt2": pt2},
        created="2026-11-29T00:00:00+00:00",
    )


def test_a_named_axis_past_the_packages_bound_is_a_400_naming_it() -> None:
    manifest = _manifest({"seq": 64, "batch": 32})
    assert bounded.axis_bounds(manifest, "pt2") == {"seq": 64}  # the batch is split instead
    assert bounded.axis_bounds(manifest, "onnx") == {}
    limits = codec.Limits(max_axes=bounded.axis_bounds(manifest, "pt2"))
    specs = manifest.input_specs("pt2")
    ok = codec.decode_request({"inputs": [[1] * 64] * 40}, specs, False, limits=limits)
    assert ok.arrays["ids"].shape == (40, 64)  # 40 samples: past the batch bound, still taken
    with pytest.raises(codec.RequestError, match=r"65 along 'seq'.*at most 64") as err:
        codec.decode_request({"inputs": [[1] * 65]}, specs, False, limits=limits)
    assert err.value.status == 400 and err.value.expected["max_sizes"] == {"seq": 64}
    oip = {
        "inputs": [
            {
                "name": "ids",
                "shape": [1, 65],
                "datatype": "INT64",
                "data": np.ones(65, np.int64).tolist(),
            }
        ]
    }
    with pytest.raises(codec.RequestError, match="along 'seq'"):
        codec.decode_request(oip, specs, False, limits=limits)
