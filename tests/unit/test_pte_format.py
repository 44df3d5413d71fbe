"""The .pte format's own logic, in process: its place in the registry, the sizes it plans
for, what it says without ExecuTorch, and how a runtime failure is named."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from pipeline.cli import build_parser
from pipeline.core.errors import ExportRequestError
from pipeline.export.config import ExportConfig
from pipeline.formats import base as registry
from pipeline.formats import pte
from pipeline.zoo import get_entry
from pipeline_runtime import etprogram, formats, runners

NOT_INSTALLED = "ExecuTorch is not installed"


def test_pte_is_an_opt_in_float32_format_no_runtime_serves() -> None:
    fmt = registry.get("pte")
    assert fmt.precision == registry.FLOAT32 and not fmt.default and not fmt.served
    assert fmt.runner == formats.EXECUTORCH and fmt.native == "pipeline.formats.pte_runner"
    assert "pte" in registry.full_precision_keys() and "pte" not in registry.served_keys()
    assert not formats.served("pte") and formats.served("onnx")
    assert not formats.served("no_such_format")


def test_every_dynamic_axis_gets_a_largest_size() -> None:
    digits = get_entry("digits_lenet")
    example = digits.golden_inputs(torch.Generator().manual_seed(0))
    assert pte.max_sizes(digits, example, {}) == {"batch": pte.MAX_BATCH}
    loop = get_entry("my_rnn_loop")
    example = loop.sample_inputs(loop.sizes(batch=3, seq=12), torch.Generator().manual_seed(0))
    assert pte.max_sizes(loop, example, {}) == {"batch": 64, "seq": 12 * pte.OTHER_AXIS_FACTOR}
    assert pte.max_sizes(loop, example, {"seq": 12}) == {"batch": 64}  # --fix-axis seq=12


def test_a_failed_kernel_is_named_from_the_runtime_log() -> None:
    printed = (
        "[op_copy.cpp:83] Check failed (tensor_is_broadcastable_to(src, in)): \n"
        "[method.cpp:1483] KernelCall failed at instruction 0:3 in operator aten::copy_.: 0x12\n"
    )
    why = pte._why(RuntimeError("method->execute() failed with error 0x12"), printed)
    assert why == "ExecuTorch's aten::copy_ kernel failed (tensor_is_broadcastable_to(src, in))"
    assert pte._why(RuntimeError("boom\nmore"), "") == "boom"


def test_only_a_failure_one_size_may_cure_is_told_to_fix_an_axis() -> None:
    """A channels_last model's convolution failed its layout check at every --fix-axis, and
    the export told the user to fix one anyway."""
    fix = " A .pte of one size may run: export it with --fix-axis batch=2."
    layout = (  # the runtime's log for a model that called .to(memory_format=channels_last)
        "[tensor_util_portable.cpp:130] Check failed (all_contiguous || all_channels_last): "
        "3 input tensors have different dim orders\n"
        "[method.cpp:1483] KernelCall failed at instruction 0:1 in operator "
        "aten::convolution.out: 0x12\n"
    )
    said = pte.way_out_of(layout, fix)
    assert said == pte.LAYOUT_WAY_OUT and "--fix-axis batch" not in said
    assert "contiguous" in said and "channels_last" in said
    sizes = "[op_copy.cpp:83] Check failed (tensor_is_broadcastable_to(src, in)): \n"
    assert pte.way_out_of(sizes, fix) == fix
    assert pte.way_out_of("", fix) == fix  # nothing logged: it may still be a size
    dtypes = "[op_add.cpp:40] Check failed (tensors_have_same_dtype(a, b, out)): \n"
    assert pte.way_out_of(dtypes, fix) == ""


def test_all_leaves_pte_out_with_one_line_when_executorch_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(etprogram, "version", lambda: None)
    args = build_parser().parse_args(["export", "--format", "all"])
    with caplog.at_level(logging.INFO, logger="pipeline.export"):
        config = ExportConfig.from_args(args)
    assert "pte" not in config.formats and "onnx" in config.formats
    said = [r.getMessage() for r in caplog.records if "leaves" in r.getMessage()]
    assert said == [f"--format all leaves ExecuTorch .pte out: {NOT_INSTALLED}; install "
                    f"{etprogram.INSTALL}"]  # fmt: skip
    # Asked for by name, it is kept, and its export stops saying what to install.
    named = ExportConfig.from_args(build_parser().parse_args(["export", "--format", "pte"]))
    assert named.formats == ("pte",)
    with pytest.raises(ExportRequestError, match=f"--format pte needs ExecuTorch: {NOT_INSTALLED}"):
        pte.export(torch.nn.Identity(), None)  # type: ignore[arg-type]


def test_a_program_that_does_not_load_names_what_the_runtime_lacks(tmp_path: Path) -> None:
    record = {
        etprogram.OPERATORS_KEY: ["aten::add.out", "mine::fancy_op.out"],
        etprogram.DELEGATES_KEY: ["XnnpackBackend", "NoSuchBackend"],
    }
    assert etprogram.missing(record) == (["mine::fancy_op.out"], ["NoSuchBackend"])
    broken = tmp_path / "model.pte"
    broken.write_bytes(b"not a program")
    with pytest.raises(runners.LoadError) as err:
        runners.load("pte", broken, inputs=["x"], outputs=["y"], record=record)
    message = str(err.value)
    assert "cannot load model.pte" in message
    assert (
        "this runtime has no kernel for mine::fancy_op.out, the NoSuchBackend delegate" in message
    )


def test_calibration_batches_are_cut_to_the_planned_batch() -> None:
    from pipeline.formats.pte_int8 import _slices

    entry = get_entry("digits_lenet")
    batch = {"image": torch.arange(150.0).reshape(150, 1, 1, 1).expand(150, 1, 28, 28)}
    pieces = _slices(batch, entry, 64)
    assert [p["image"].shape[0] for p in pieces] == [64, 64, 22]
    assert torch.equal(torch.cat([p["image"] for p in pieces]), batch["image"])  # all, in order


def test_validation_batches_are_ones_each_artifact_takes() -> None:
    from pipeline.export.quality import (
        VALIDATION_BATCH,
        batch_fixed,
        validation_batch,
        validation_batches,
    )

    assert validation_batch({}) == VALIDATION_BATCH
    assert validation_batch({"max_sizes": {"batch": 64}}) == 64  # an ExecuTorch program
    assert validation_batch({"max_sizes": {"batch": 512}}) == VALIDATION_BATCH
    fixed = {"fixed_axes": {"batch": 3}, "max_sizes": {"batch": 64}}
    assert validation_batch(fixed) == 3 and batch_fixed(fixed) and not batch_fixed({})
    entry = get_entry("digits_lenet")
    sizes = [x["image"].shape[0] for x, _ in validation_batches(entry, 64)]
    assert max(sizes) == 64 and sum(sizes) == 361  # the last one shorter: dynamic batch
    whole = [x["image"].shape[0] for x, _ in validation_batches(entry, 3, whole=True)]
    assert set(whole) == {3} and sum(whole) == 360  # one size only: the remainder left out


def test_a_lowering_failure_says_its_cause_and_the_way_out() -> None:
    """pte_int8 said "XNNPACK reshape only supports 1 dynamic dimension. This may occur
    when." (ExecuTorch's sentence ends there) with no way out, and "An error occurred when
    running the 'ChannelsLastTaggedReshapePass' pass" without the IndexError behind it."""
    from pipeline.formats.pte import lowering_error, not_lowered

    try:
        try:
            torch.zeros(())[0]
        except IndexError as cause:
            raise Exception(
                "An error occurred when running the 'ChannelsLastTaggedReshapePass' pass "
                "after the following passes: []"
            ) from cause
    except Exception as err:  # noqa: BLE001 - the wrapped failure, as ExecuTorch raises it
        said = lowering_error(err)
    assert "pass after the following passes: [] (from IndexError: invalid index of a 0-dim" in said
    reshape = RuntimeError(
        "XNNPACK reshape only supports 1 dynamic dimension. This may occur when \n"
    )
    entry = get_entry("lstm_tagger")  # dynamic batch and seq
    message = str(not_lowered(reshape, None, None, entry, "export"))  # type: ignore[arg-type]
    assert "1 dynamic dimension. Export with --fix-axis seq=N to make the .pte for" in message
    assert "This may occur" not in message and "batch=N" not in message


def test_the_runners_failure_is_told_by_the_kernels_check_not_the_argument_dump() -> None:
    # What pte_runner printed for a token id past the vocabulary (a user's trial): the
    # last 600 characters were ExecuTorch's "arg N with type id M" lines alone.
    from pipeline.formats.pte_runner import runner_said

    dump = "".join(
        f"E 00:00:00.00166{i} executorch:method.cpp:1493] arg {i} with type id 1\n"
        for i in range(7)
    )
    stderr = (
        "[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version\n"
        "E 00:00:00.001649 executorch:op_embedding.cpp:43] Check failed (indices_ptr[i] < "
        "weight_height): indices_ptr[1] 70 >= weight.size(0) 50\n"
        "E 00:00:00.001657 executorch:method.cpp:1483] KernelCall failed at instruction 0:0 "
        "in operator aten::embedding.out: 0x12\n" + dump + "pte_runner: case 0: forward failed: "
        "Error::InvalidArgument\n"
    )
    said = runner_said(stderr)
    assert said.startswith(
        "executorch:op_embedding.cpp:43] Check failed (indices_ptr[i] < weight_height): "
        "indices_ptr[1] 70 >= weight.size(0) 50 | executorch:method.cpp:1483] KernelCall"
    ), said
    assert said.endswith("| pte_runner: case 0: forward failed: Error::InvalidArgument")
    assert "type id" not in said and "cpuinfo" not in said
