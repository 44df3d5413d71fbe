"""Why torch.export failed (pipeline/formats/explain.py), on real torch.export failures: a
branch in the model's own code gets the torch.cond advice at its line; one in a library's
code (torchvision's batched NMS, what every torchvision detector's `.pt2` and `.pte` stop
on) names the library's line and the model's call, and does not send the user to rewrite
code that is not theirs (a user's trial, 2026-11-28, got the torch.cond advice for it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torchvision

from pipeline.formats.explain import COND_HINT, _cut, explain, fix_axis_hint, library_site


class _Nms(torch.nn.Module):
    """What a detector's postprocessing does: NMS over the boxes that passed a threshold."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = x[:, 0] > 0.5
        boxes, scores = x[keep][:, 1:5], x[:, 0][keep]
        return torchvision.ops.batched_nms(boxes, scores, torch.zeros_like(scores).long(), 0.5)


class _Gate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # the model's own branch on a value
            return x * 2
        return -x


def _failure(model: torch.nn.Module, shape: tuple[int, ...]) -> BaseException:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever torch.export raises
        torch.export.export(model, (torch.rand(*shape),), strict=False)
    return caught.value


def test_a_branch_in_torchvisions_nms_is_named_there_without_the_torch_cond_advice() -> None:
    said = explain(_failure(_Nms(), (20, 5)))
    assert said.startswith("torch.export failed at torchvision's code (torchvision/ops/boxes.py:")
    assert f"called from {__file__}" in said or "called from tests/unit/test_explain.py:" in said
    assert "torch.cond in your code cannot remove it" in said, said
    assert "cannot be written as a .pt2 or .pte" in said and "torch.cond(pred" not in said, said


def test_a_branch_in_the_models_own_code_keeps_the_torch_cond_advice() -> None:
    said = explain(_failure(_Gate(), (4,)))
    assert "test_explain.py:" in said and "(if x.sum() > 0:" in said, said
    assert "(the code branches on a tensor's value)" in said and COND_HINT in said, said
    assert "library" not in said, said


def test_library_site_tells_an_installed_package_from_the_users_file(tmp_path: Path) -> None:
    site = next(p for p in sys.path if p.endswith("site-packages"))
    absolute = f"Caused by: ({site}/torchvision/ops/boxes.py:103 in _batched_nms_coordinate_trick)"
    assert library_site(absolute) == (
        "torchvision",
        f"{site}/torchvision/ops/boxes.py:103 in _batched_nms_coordinate_trick",
    )
    relative = "Caused by: (torchvision/ops/boxes.py:103 in _batched_nms_coordinate_trick)"
    assert library_site(relative)[0] == "torchvision"  # type: ignore[index]
    mine = tmp_path / "model.py"
    mine.write_text("")
    assert library_site(f"Caused by: ({mine}:3 in forward)") is None
    assert library_site("Caused by: (my_models/net.py:3 in forward)") is None  # not installed
    assert library_site("no location given") is None


def test_a_long_guard_is_cut_at_a_space_and_marked() -> None:
    guard = "Could not guard on data-dependent expression " + " + ".join(
        f"4*Min(400, u{i})" for i in range(200)
    )
    cut = _cut(guard)
    assert len(cut) <= 202 and cut.endswith(" …") and "u1." not in cut
    assert _cut("short.") == "short"


def test_the_fix_axis_way_out_names_both_formats_it_applies_to() -> None:
    assert ".pt2 or .pte for that one length" in fix_axis_hint("seq")
    assert "--fix-axis seq=N" in fix_axis_hint("seq")
