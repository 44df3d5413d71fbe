"""Intermediate values: eager PyTorch's per module, and an ONNX file's, matched by module path.

Eager's come from forward hooks (every module's output, in the order modules
finish: leaves before their parents). An ONNX file names the PyTorch module
each node came from: the `torch.export`-based exporter writes the module path
into every node's metadata (`pkg.torch.onnx.name_scopes`, torch 2.14), and the
TorchScript-based exporter into the node's name (`/layer1/0/conv1/Conv`). A
module's output in the graph is a value made inside its scope and used
outside it, so module outputs can be matched without re-tracing the model
(re-running torch.export with the exporter's decompositions, to get eager
values under the exporter's FX node names, took about 8 s on
mobilenet_v3_small; hooks and two ORT runs take well under a second).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper
from torch import nn

from pipeline.core.compare import Comparison, Kind, compare_tensor
from pipeline_runtime.outputs import flatten_outputs
from pipeline_runtime.runners import ort_session_options

NAME_SCOPES = "pkg.torch.onnx.name_scopes"  # written by torch.onnx.export(dynamo=True)


@dataclass
class Call:
    """One call of one eager module: what it was given and what it returned (copies)."""

    path: str  # "" for the model itself
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[torch.Tensor] | None  # flattened; None when it returned something else


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _tensors(output: Any) -> list[torch.Tensor] | None:
    try:
        return [t.detach().clone() for t in flatten_outputs(output)]
    except TypeError:  # None, numbers, custom objects: nothing to compare
        return None


def capture(model: nn.Module, inputs: Mapping[str, torch.Tensor], *, args: bool) -> list[Call]:
    """Run `model` once on `inputs`; every module call, in the order calls finish.

    Values are copied when the hook fires: an in-place module later on
    (`ReLU(inplace=True)` in resnet) would otherwise change them afterwards.
    `args`: keep each call's inputs too (TorchScript replays them).
    """
    calls: list[Call] = []
    pending: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def before(module: nn.Module, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
        pending.append(_clone((a, kw)) if args else ((), {}))

    def after(path: str) -> Any:
        def hook(module: nn.Module, a: tuple[Any, ...], kw: dict[str, Any], out: Any) -> None:
            given, given_kw = pending.pop()
            calls.append(Call(path, module, given, given_kw, _tensors(out)))

        return hook

    handles = []
    try:
        for path, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(module.register_forward_hook(after(path), with_kwargs=True))
        with torch.no_grad():
            model(*inputs.values())
    finally:
        for handle in handles:
            handle.remove()
    return calls


Compared = Comparison  # what every check here returns


def compare(expected: torch.Tensor, actual: torch.Tensor, atol: float, rtol: float) -> Compared:
    """`torch.allclose`'s rule, with NaN/Inf where eager is finite departing: the
    project's comparison without its report statistics, which would cost ~0.15 s
    per activation-sized tensor, and a model has hundreds."""
    return compare_tensor(expected, actual, atol, rtol, detail=False)


def problem(c: Compared) -> str:
    """What the numbers alone do not say (shape, dtype, NaN/Inf), else ""."""
    return "" if c.passed or c.kind is Kind.TOLERANCE else c.problem


# --- the ONNX side -------------------------------------------------------------


def node_scope(node: onnx.NodeProto, modules: set[str]) -> str | None:
    """The path of the innermost eager module `node` belongs to; None when it does not say.

    A scope that names no module of the eager model (the TorchScript-based
    exporter calls a module's second call `relu_1`, and drops scopes inside
    scripted code) falls back to its longest prefix that does.
    """
    for prop in node.metadata_props:
        if prop.key == NAME_SCOPES:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            # ['', 'features', 'features.0', ..., '<FX node name>']: full paths, root first
            return next((s for s in reversed(scopes[:-1]) if s in modules), "")
    if node.name.startswith("/"):  # "/layer1/0/conv1/Conv": attribute names, op last
        parts = node.name.split("/")[1:-1]
        for k in range(len(parts), 0, -1):
            for candidate in (".".join(parts[:k]), parts[k - 1]):
                if candidate in modules:
                    return candidate
        return ""
    return None


def used_names(node: onnx.NodeProto) -> set[str]:
    """Every value `node` reads, the ones its If/Loop/Scan bodies read from outside included."""
    names = set(node.input)
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in graph.node:
                names |= used_names(inner)
    names.discard("")
    return names


def _parts(scope: str) -> tuple[str, ...]:
    return tuple(scope.split(".")) if scope else ()


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class GraphScopes:
    outputs: dict[str, list[str]]  # module path → the values it outputs, in graph order
    producer: dict[str, onnx.NodeProto]  # value → the top-level node that makes it
    scoped: int  # top-level nodes that name a module


def module_outputs(model: onnx.ModelProto, modules: set[str]) -> GraphScopes:
    """For every module with nodes in the graph, the values made inside it and used outside.

    A value made in scope S and read by a node in scope C leaves every module
    on S's path deeper than S and C's common prefix; a graph output leaves
    them all. Nodes that name no scope count as the top level.
    """
    graph = model.graph
    scopes = [node_scope(n, modules) for n in graph.node]
    producer: dict[str, onnx.NodeProto] = {}
    made_in: dict[str, tuple[str, ...]] = {}
    for node, scope in zip(graph.node, scopes, strict=True):
        for out in node.output:
            if out:
                producer[out] = node
                made_in[out] = _parts(scope or "")
    left_at: dict[str, int] = {o.name: -1 for o in graph.output}  # deepest common prefix
    for node, scope in zip(graph.node, scopes, strict=True):
        here = _parts(scope or "")
        for name in used_names(node):
            if name in made_in:
                common = _common(made_in[name], here)
                left_at[name] = min(left_at.get(name, common), common)
    outputs: dict[str, list[str]] = {}
    for node in graph.node:
        for out in node.output:
            if out in left_at:
                path = made_in[out]
                for depth in range(left_at[out] + 1, len(path) + 1):
                    outputs.setdefault(".".join(path[:depth]), []).append(out)
    return GraphScopes(outputs, producer, sum(s is not None for s in scopes))


def graph_feed(model: onnx.ModelProto, inputs: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """`inputs` keyed by the graph's input names: by name, else by position (the
    TorchScript-based exporter may rename an input "x.1")."""
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    given = [inputs[n] for n in names] if all(n in inputs for n in names) else list(inputs.values())
    return {n: t.detach().cpu().numpy() for n, t in zip(names, given, strict=True)}


def run_marked(
    model: onnx.ModelProto, names: Iterable[str], feed: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """One ONNX Runtime run of `model` with `names` added as graph outputs (as Polygraphy's
    `--onnx-outputs mark all` does); every output by name.

    Untyped output declarations are enough: ORT infers their types, which
    spares shape inference on graphs where it is incomplete.
    """
    import onnxruntime as ort

    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    existing = {o.name for o in marked.graph.output}
    for name in names:
        if name not in existing:
            marked.graph.output.append(helper.make_empty_tensor_value_info(name))
            existing.add(name)
    session = ort.InferenceSession(
        marked.SerializeToString(), ort_session_options(), providers=["CPUExecutionProvider"]
    )
    wanted = [o.name for o in session.get_outputs()]
    given = {i.name: feed[i.name] for i in session.get_inputs()}
    return dict(zip(wanted, session.run(wanted, given), strict=True))


EAGER_PREFIX = "eager::"


def cut_at(model: onnx.ModelProto, eager: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` whose nodes read eager's value of each name in `eager` (a new
    graph input `eager::<name>`) instead of the one computed upstream.

    Run on it, every value carries only the error of the nodes since the last
    cut, as a TorchScript submodule run alone on eager's inputs does: rounding
    carried through fifty layers no longer counts against the fiftieth.
    """
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    graph = cut.graph
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in eager:
                node.input[k] = EAGER_PREFIX + name
    for name, array in eager.items():
        graph.input.append(
            helper.make_tensor_value_info(
                EAGER_PREFIX + name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
            )
        )
    return cut


Pair = tuple[int, int, str]  # (index of the eager call, index of its output, ONNX value)


def pair_outputs(
    calls: list[Call], scopes: GraphScopes, graph_outputs: list[str], shapes: Mapping[str, Any]
) -> list[Pair]:
    """Every eager module output found in the graph, in the order the calls finished.

    `shapes`: (shape, dtype) of each value ORT computed. A module called once:
    each output goes to the one value it outputs with that shape and dtype
    (none or several: not matched). A module called n times with one output and
    n values: in order. The model itself: the graph outputs, in order (when
    there are as many as it returns).
    """
    by_path: dict[str, list[int]] = {}
    for i, call in enumerate(calls):
        by_path.setdefault(call.path, []).append(i)
    pairs: list[Pair] = []
    for path, indexes in by_path.items():
        outs = [calls[i].outputs for i in indexes]
        if not path:
            if len(indexes) == 1 and outs[0] is not None and len(outs[0]) == len(graph_outputs):
                pairs += [(indexes[0], j, v) for j, v in enumerate(graph_outputs) if v in shapes]
            continue
        values = [v for v in scopes.outputs.get(path, []) if v in shapes]
        if len(indexes) == 1 and outs[0] is not None:
            for j, t in enumerate(outs[0]):
                same = [v for v in values if shapes[v] == (tuple(t.shape), t.dtype)]
                if len(same) == 1:
                    pairs.append((indexes[0], j, same[0]))
        elif len(values) == len(indexes) and all(o is not None and len(o) == 1 for o in outs):
            for i, o, v in zip(indexes, outs, values, strict=True):
                if shapes[v] == (tuple(o[0].shape), o[0].dtype):  # type: ignore[index]
                    pairs.append((i, 0, v))
    return sorted(pairs)


def fused_modules(
    node: onnx.NodeProto, path: str, initializers: set[str], modules: Mapping[str, nn.Module]
) -> str:
    """'features.0.0 (Conv2d)': other modules whose parameters `node` reads. The exporter
    folds a BatchNorm into the Conv before it, under the Conv's weight name, so that
    Conv has no output of its own in the graph."""
    owners: list[str] = []
    for name in node.input:
        owner = name.rpartition(".")[0]
        if name in initializers and owner in modules and owner != path and owner not in owners:
            owners.append(owner)
    return ", ".join(f"{o} ({type(modules[o]).__name__})" for o in owners)
