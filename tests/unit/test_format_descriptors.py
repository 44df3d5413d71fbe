"""Format descriptors (pipeline_runtime/formats.py): what a serving process knows of a
format without importing its module, and where it finds one it was never told of."""

from __future__ import annotations

import pytest

from pipeline.formats import base as registry
from pipeline_runtime import formats

CARRIED = formats.Descriptor("onnx_mine", "model.mine.onnx", formats.ONNXRUNTIME)


def test_every_built_in_format_registers_the_descriptor_the_runtime_ships() -> None:
    assert {f.key for f in registry.all_formats()} == set(formats.BUILTIN)
    for fmt in registry.all_formats():
        assert fmt.descriptor == formats.BUILTIN[fmt.key], fmt.key
    assert set(formats.onnxruntime_keys()) == {
        k for k, d in formats.BUILTIN.items() if d.torch_free
    }


def test_a_format_unknown_here_is_run_from_the_descriptor_its_record_carries() -> None:
    record = {"opset": 20, formats.RECORD_KEY: CARRIED.to_json()}
    assert formats.of("onnx_mine", record) == CARRIED
    with pytest.raises(formats.UnknownFormatError, match="re-export it"):
        formats.of("onnx_mine", {"opset": 20})
    with pytest.raises(formats.UnknownFormatError):
        formats.of("onnx_mine")


def test_added_descriptors_are_known_until_removed_and_built_ins_stay() -> None:
    formats.add(CARRIED)
    try:
        assert formats.of("onnx_mine") == CARRIED and "onnx_mine" in formats.onnxruntime_keys()
        with pytest.raises(ValueError, match="already described"):
            formats.add(formats.Descriptor("onnx_mine", "other.onnx", formats.ONNXRUNTIME))
    finally:
        formats.remove("onnx_mine")
    with pytest.raises(formats.UnknownFormatError):
        formats.of("onnx_mine")
    with pytest.raises(ValueError, match="built in"):
        formats.remove("onnx")
    with pytest.raises(ValueError, match="already described"):
        formats.add(formats.Descriptor("onnx", "model.onnx", formats.AOTI))


def test_a_runner_kind_no_loader_knows_is_refused() -> None:
    from pipeline_runtime import runners

    assert set(runners.LOADERS) == set(formats.RUNNERS)
    with pytest.raises(ValueError, match="is not one of"):
        formats.Descriptor("x", "model.x", "tensorrt")
