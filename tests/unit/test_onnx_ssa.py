"""An output named like one of the model's modules: torch.onnx's default exporter wrote two
values named "embedding" (the nn.Embedding's Gather and the output), onnx.checker refused
the graph, and the ONNX export failed (a user's own text classifier, 2026-11-29)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from pipeline.export import ExportConfig, export
from pipeline.formats.onnxssa import renamed_duplicates
from pipeline.zoo.spec import TensorSpec

SOURCE = """
import torch
from torch import nn


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 8)
        self.linear = nn.Linear(8, 4)

    def forward(self, ids, mask):
        e = self.embedding(ids) * mask.unsqueeze(-1)
        pooled = e.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return {"logits": self.linear(pooled), "embedding": torch.tanh(pooled)}
"""


def test_an_output_named_like_a_module_exports_to_onnx_and_answers_right(tmp_path: Path) -> None:
    (tmp_path / "textclf.py").write_text(SOURCE)
    result = export(
        ExportConfig(
            model=f"{tmp_path / 'textclf.py'}:TextClassifier",
            inputs=[
                TensorSpec("ids", ("batch", "seq"), torch.int64, 0, 10, bounded=True),
                TensorSpec("mask", ("batch", "seq"), torch.float32, 0, 2),
            ],
            random_init=True,
            checkpoint=tmp_path / "art" / "checkpoint.pt",
            out_dir=tmp_path / "art" / "export",
            formats=("onnx",),
        )
    )
    assert "onnx" in result.manifest.artifacts, result.manifest.failed
    path = result.out_dir / "model.onnx"
    model = onnx.load(str(path))
    assert [o.name for o in model.graph.output] == ["logits", "embedding"]
    onnx.checker.check_model(str(path), full_check=True)
    ids = np.array([[1, 2, 3, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0]], dtype=np.float32)
    got = ort.InferenceSession(str(path)).run(None, {"ids": ids, "mask": mask})
    assert got[1].shape == (1, 8) and np.all(np.abs(got[1]) <= 1)  # tanh: the pooled output


def test_only_the_inner_making_is_renamed_and_its_readers_follow() -> None:
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Identity", ["x"], ["y"]),
            onnx.helper.make_node("Neg", ["y"], ["z"]),
            onnx.helper.make_node("Abs", ["z"], ["y"]),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    assert renamed_duplicates(graph) == ["y"]
    assert [(list(n.input), list(n.output)) for n in graph.node] == [
        (["x"], ["y_1"]),
        (["y_1"], ["z"]),
        (["z"], ["y"]),
    ]
    assert renamed_duplicates(graph) == []  # nothing twice now
