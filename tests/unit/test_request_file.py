"""What `pipeline infer` sends from a file (pipeline/serving/client.py read_request_file)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.serving.client import ClientError, read_request_file


def test_infer_says_how_to_name_a_list_of_tensors(tmp_path: Path) -> None:
    """`torch.save([x, h])`, the C++ client's form, was refused with "must hold a tensor
    or a dict of named tensors" and no word on the names (a user's trial, 2026-11-28)."""
    path = tmp_path / "b1.pt"
    torch.save([torch.zeros(1, 3), torch.zeros(1, 4)], path)
    with pytest.raises(ClientError, match=r"holds a list of 2; a server takes inputs by name"):
        read_request_file(path)
    torch.save({"x": torch.zeros(1, 3)}, path)
    assert read_request_file(path)[1] == "application/json"
