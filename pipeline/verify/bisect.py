"""The smallest ONNX subgraph that departs from eager on its own, written out as a repro.

Starting from the diverging value, walk back through its producers until
every input is a value eager PyTorch computed too (a graph input or a module
output that matched). That subgraph is run alone in ONNX Runtime on eager's
values: if it still departs, the fault is inside it. If it does not, the
departure was error carried in from upstream, so the start moves one set of
known values further back and the check runs again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper

from pipeline.verify.intermediates import compare, used_names
from pipeline_runtime.runners import ort_session_options

# Growing one frontier at a time costs an ORT session each; past this many,
# the last try starts from the graph inputs.
MAX_STEPS = 8


@dataclass(frozen=True)
class Isolated:
    path: Path | None  # the subgraph written, None when none departs alone
    note: str


def _stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "model"


def _walk_back(
    target: str, cut: set[str], producer: Mapping[str, int], graph: onnx.GraphProto
) -> tuple[list[str], list[int]]:
    """From `target` back to the values in `cut`: (those values, the indexes of the nodes
    passed, in graph order). Initializers and names local to an If/Loop/Scan body end
    the walk without becoming inputs."""
    starts: list[str] = []
    nodes: set[int] = set()
    seen: set[str] = set()
    stack = [target]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name != target and name in cut:
            starts.append(name)
        elif name in producer and producer[name] not in nodes:
            nodes.add(producer[name])
            stack.extend(used_names(graph.node[producer[name]]))
    return sorted(starts), sorted(nodes)


def _subgraph(
    model: onnx.ModelProto,
    nodes: list[int],
    starts: list[str],
    target: str,
    arrays: Mapping[str, np.ndarray],
) -> onnx.ModelProto:
    """The nodes `nodes` of `model` as a model of their own, `starts` in, `target` out.

    Built here rather than with `onnx.utils.extract_model`: that follows only
    `node.input`, so an If/Loop/Scan whose body reads an initializer of the
    outer graph (the torch.cond formulations) lost it; and it needs declared
    types for the cut, which the TorchScript-based exporter mostly omits.
    """
    graph = model.graph
    picked = [graph.node[i] for i in nodes]
    used = set().union(*(used_names(n) for n in picked)) | {o for n in picked for o in n.output}
    io = {*starts, target}

    def declared(name: str) -> onnx.ValueInfoProto:
        array = arrays[name]
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)
        )

    sub = helper.make_graph(
        picked,
        f"{graph.name or 'graph'}: {target} alone",
        [declared(s) for s in starts],
        [declared(target)],
        initializer=[t for t in graph.initializer if t.name in used],
        value_info=[v for v in graph.value_info if v.name in used and v.name not in io],
    )
    return helper.make_model(
        sub,
        ir_version=model.ir_version,
        opset_imports=model.opset_import,
        functions=model.functions,
        producer_name="pipeline verify --bisect",
    )


def _run_alone(model: onnx.ModelProto, known: Mapping[str, np.ndarray], target: str) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(
        model.SerializeToString(), ort_session_options(), providers=["CPUExecutionProvider"]
    )
    feed = {i.name: known[i.name] for i in session.get_inputs()}
    return session.run([target], feed)[0]


def isolate(
    model: onnx.ModelProto,
    target: str,
    known: Mapping[str, np.ndarray],
    expected: np.ndarray,
    atol: float,
    rtol: float,
    out_dir: Path,
    name: str,
) -> Isolated:
    """Write `<out_dir>/<name>.onnx` (+ `.npz` of its inputs and expected output): the
    smallest subgraph computing `target` from values in `known` that departs from
    `expected` when run alone. `known`: eager's values for ONNX value names, the
    graph inputs among them."""
    graph = model.graph
    graph_inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    arrays = {**known, target: expected}
    cut = set(known) - {target}
    for step in range(MAX_STEPS + 1):
        if step == MAX_STEPS:
            cut = set(graph_inputs)
        starts, nodes = _walk_back(target, cut, producer, graph)
        try:
            sub = _subgraph(model, nodes, starts, target, arrays)
            onnx.checker.check_model(sub)
            got = _run_alone(sub, known, target)
        except Exception as err:  # noqa: BLE001 - an unextractable cut is reported, not raised
            first = " ".join(str(err).split())[:200]
            return Isolated(None, f"could not extract {target!r}: {type(err).__name__}: {first}")
        c = compare(torch.from_numpy(expected), torch.from_numpy(got), atol, rtol)
        if not c.passed:
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{_stem(name)}.onnx"
            onnx.save(sub, str(path))
            np.savez(
                path.with_suffix(".npz"), **{s: known[s] for s in starts}, **{target: expected}
            )
            grown = f", grown {step} time(s)" if step else ""
            return Isolated(
                path,
                f"{len(nodes)} node(s) from {', '.join(map(repr, starts))} to {target!r} depart "
                f"alone on eager's values (max abs err {c.max_abs:.1e}{grown})",
            )
        inner = set(starts) - graph_inputs
        if not inner:
            break
        cut -= inner
    return Isolated(
        None,
        f"no subgraph ending at {target!r} departs from eager on its own, not even from the "
        "graph inputs: the departure could not be isolated",
    )
