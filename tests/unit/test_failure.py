"""A model's failure as a client reads it: one line, no traceback, no server paths.

The 500 of a TorchScript failure carried the interpreter's whole traceback (the model's
source and the server's file paths) on TorchServe's handler and the KServe runtime's REST
path; the Ray runtime answered Serve's text 500 instead of JSON.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from pipeline_runtime.failure import MAX_CHARS, summary


class _View(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(3, 7) + 1


def _raised(call: Callable[[], object]) -> BaseException:
    with pytest.raises(RuntimeError) as info:
        call()
    return info.value


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit's deprecation notice
def test_a_scripted_models_failure_is_its_last_line_without_source_or_paths() -> None:
    err = _raised(lambda: torch.jit.script(_View())(torch.zeros(2, 5)))
    assert "Traceback of TorchScript" in str(err) and __file__ in str(err)  # what it was
    assert summary(err) == "RuntimeError: shape '[3, 7]' is invalid for input of size 10"


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_traced_models_failure_drops_the_recorded_python_frames() -> None:
    traced = torch.jit.trace(nn.Linear(4, 2), torch.zeros(1, 4))
    err = _raised(lambda: traced(torch.zeros(1, 3)))
    assert "linear.py(" in str(err)  # the frames recorded at trace time, with their paths
    text = summary(err)
    assert text.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert "\n" not in text and ".py" not in text


def test_a_libtorch_error_loses_its_cpp_frames_and_keeps_its_message() -> None:
    err = RuntimeError(
        "The size of tensor a (4) must match the size of tensor b (3) at non-singleton "
        "dimension 1\nException raised from infer_size_impl at "
        "/pytorch/aten/src/ATen/ExpandUtils.cpp:31 (most recent call first):\n"
        "frame #0: c10::Error::Error(...) + 0x9a (0x7f in /opt/lib/libc10.so)\n"
    )
    assert summary(err) == (
        "RuntimeError: The size of tensor a (4) must match the size of tensor b (3) at "
        "non-singleton dimension 1"
    )


def test_a_multi_line_message_is_one_line_and_a_long_one_is_cut() -> None:
    ort = RuntimeError(
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x\n"
        " index: 1 Got: 3 Expected: 4\n Please fix either the inputs/outputs or the model."
    )
    assert summary(ort) == (
        "RuntimeError: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions "
        "for input: x index: 1 Got: 3 Expected: 4 Please fix either the inputs/outputs or "
        "the model."
    )
    long = summary(ValueError("x" * 5000))
    assert len(long) == MAX_CHARS and long.endswith("…")
    assert summary(KeyError()) == "KeyError: (no message)"


def test_a_ray_task_failure_is_told_by_its_cause_not_the_replicas_traceback() -> None:
    from ray.exceptions import RayTaskError

    remote = 'Traceback (most recent call last):\n  File "/srv/app.py", line 3\nValueError: bad'
    err = RayTaskError("handle_request", remote, ValueError("bad token 99"), pid=7)
    err = err.as_instanceof_cause()  # what awaiting a failed deployment response raises
    assert "/srv/app.py" in str(err)
    assert summary(err) == "ValueError: bad token 99"
