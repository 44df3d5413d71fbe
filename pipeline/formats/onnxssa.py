"""One name per value in an ONNX graph the default exporter wrote (static single assignment).

torch.onnx's exporter (dynamo=True) names each value after the operation or module that
made it, then renames the graph's outputs as asked. A model whose output is named like one
of its modules (`{"embedding": ...}` from a model with `self.embedding = nn.Embedding`)
came out with two values named "embedding", which onnx.checker refuses ("Graph must be in
single static assignment (SSA) form"): the ONNX export failed (a user's own model, 2026-11-29).
The inner value is renamed here; the graph's outputs keep the names asked for.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx


def renamed_duplicates(graph: onnx.GraphProto) -> list[str]:
    """Rename every value of `graph` made more than once, all but its last making (the one
    later nodes and the graph's outputs read), and the inputs that read each; the names."""
    made = Counter(name for node in graph.node for name in node.output if name)
    left = {name: n for name, n in made.items() if n > 1}
    if not left:
        return []
    taken = set(made) | {i.name for i in graph.input} | {i.name for i in graph.initializer}
    alias: dict[str, str] = {}
    for node in graph.node:  # topological order: a value is read after it is made
        _read_as(node, alias)
        for i, name in enumerate(node.output):
            if name not in left:
                continue
            left[name] -= 1
            if left[name] == 0:  # the last making: its own name again from here on
                alias.pop(name, None)
                continue
            k = 1
            while f"{name}_{k}" in taken:
                k += 1
            alias[name] = node.output[i] = f"{name}_{k}"
            taken.add(alias[name])
    twice = sorted(n for n, c in made.items() if c > 1)
    # A shape annotation under a name made twice says which value? Neither: dropped.
    kept = [info for info in graph.value_info if info.name not in twice]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return twice


def _read_as(node: onnx.NodeProto, alias: dict[str, str]) -> None:
    """`node`'s inputs, and those of the subgraphs it holds (If, Loop, Scan bodies read the
    outer graph's values by name), renamed as `alias` says."""
    if not alias:
        return
    for i, name in enumerate(node.input):
        if name in alias:
            node.input[i] = alias[name]
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in sub.node:
                _read_as(inner, alias)


def make_ssa(path: Path) -> list[str]:
    """Rewrite the ONNX file at `path` with one name per value, if it has duplicates."""
    model = onnx.load(str(path), load_external_data=False)
    names = renamed_duplicates(model.graph)
    if names:
        onnx.save(model, str(path))
    return names
