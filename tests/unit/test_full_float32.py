"""runners.full_float32, which every CUDA runner calls: TF32 off in a way torch itself can
still read. Its first form (the fp32_precision settings) made torch.export on CUDA fail inside
torch's own `cudnn.flags()`; the flags are CPU-side state, so this is checked here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from pipeline_runtime.runners import full_float32


@pytest.fixture
def restored() -> Iterator[None]:
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.usefixtures("restored")
def test_tf32_is_off_and_torch_can_still_read_it() -> None:
    full_float32()
    assert torch.backends.cudnn.allow_tf32 is False
    assert torch.backends.cuda.matmul.allow_tf32 is False
    with torch.backends.cudnn.flags(enabled=False):  # what torch.export enters
        pass
    program = torch.export.export(torch.nn.Conv2d(1, 2, 3), (torch.randn(1, 1, 5, 5),))
    assert program.graph_module is not None
