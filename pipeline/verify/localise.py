"""Where a backend diverges: the first PyTorch module whose output departs from eager's.

Parity says *that* an artifact is wrong; this says *where*. For each format:

* ONNX: the file on disk, its values matched to eager's module outputs by the
  module path the exporter recorded on each node (`intermediates`). ONNX
  Runtime runs it twice with those values marked as outputs: once as it is,
  and once cut at every matched value so that each is computed from eager's
  values upstream. The cut run decides: rounding carried through fifty layers
  can exceed a tolerance meant for the outputs without any op being wrong
  (random-init resnet18 does), and then the whole run only adds a note. With
  `bisect_dir`, the smallest subgraph that departs on its own is written out
  (`bisect`).
* TorchScript: every submodule of the loaded ScriptModule, run alone on the
  inputs its eager twin received, against the twin's output.
* `.pt2`: AOTInductor compiles the whole graph into one library and keeps no
  intermediate values, so there is nothing to compare.

The first departure is taken in the order eager's modules finish (leaves
before their parents), an order in which every value comes after the values
it was computed from. The pass rule is verify's (`torch.allclose`'s).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from pipeline.core.compare import Kind
from pipeline.core.errors import ArtifactError, PipelineError
from pipeline.core.paths import model_slug
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.verify.bisect import isolate
from pipeline.verify.intermediates import (
    EAGER_PREFIX,
    Call,
    Compared,
    Pair,
    capture,
    compare,
    cut_at,
    fused_modules,
    graph_feed,
    module_outputs,
    pair_outputs,
    problem,
    run_marked,
)
from pipeline_runtime.outputs import flatten_outputs

__all__ = ["Divergence", "Localisation", "localise"]


def _num(x: float) -> float | str:
    return x if np.isfinite(x) else str(x)


@dataclass(frozen=True)
class Divergence:
    """The first value that departs from eager beyond tolerance."""

    module: str  # PyTorch module path, "" for the top-level module
    op: str  # the module's class: "Conv2d"
    value: str  # the backend's name for the value: ONNX value name, TorchScript submodule path
    max_abs: float
    max_rel: float
    kind: str = "ONNX value"  # what `value` names, for people
    problem: str = ""  # a shape, dtype or NaN mismatch instead of (or beside) the numbers
    detail: str = ""  # e.g. the ONNX node, and modules the exporter fused into it

    def describe(self) -> str:
        """One line: `features.3.block.0 (Conv2d): max abs err 3.1e-01, max rel err
        2.0e+00 (ONNX value 'conv2d_7', Conv node 'node_Conv_7')`."""
        what = f"max abs err {self.max_abs:.1e}, max rel err {self.max_rel:.1e}"
        if self.problem:
            what = f"{self.problem}; {what}"
        where = f"{self.kind} {self.value!r}" + (f", {self.detail}" if self.detail else "")
        return f"{self.module or '(top level)'} ({self.op}): {what} ({where})"

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "op": self.op,
            "value": self.value,
            "kind": self.kind,
            "max_abs": _num(self.max_abs),
            "max_rel": _num(self.max_rel),
            "problem": self.problem,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Localisation:
    """What `localise` found for one backend."""

    backend: str  # e.g. "onnxruntime"
    available: bool  # False: this backend keeps no intermediates to compare; `note` says why
    divergence: Divergence | None  # None when available and nothing departs
    compared: int  # intermediate values compared
    note: str = ""
    subgraph: Path | None = None  # with bisect: the smallest failing ONNX subgraph written

    def describe(self) -> str:
        """One line for the CLI and the report."""
        if not self.available:
            return f"{self.backend}: cannot localise: {self.note}"
        if self.divergence is None:
            line = f"{self.backend}: no intermediate value departs from eager ({self.compared} compared)"
        else:
            line = f"{self.backend}: first departs at {self.divergence.describe()}"
        if self.note:
            line += f"; {self.note}"
        return line + (f"; subgraph written to {self.subgraph}" if self.subgraph else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "available": self.available,
            "divergence": self.divergence.to_json() if self.divergence else None,
            "compared": self.compared,
            "note": self.note,
            "subgraph": str(self.subgraph) if self.subgraph else None,
        }


def localise(
    exported: ExportedModel,
    fmt_key: str,
    inputs: dict[str, torch.Tensor],
    atol: float,
    rtol: float,
    *,
    bisect_dir: Path | None = None,
    backend: str | None = None,
) -> Localisation:
    """The first module whose output in artifact `fmt_key` departs from eager's on `inputs`.

    `atol`/`rtol`: the pass rule per value, `torch.allclose`'s (verify's tolerance).
    `backend`: the name to report (default: the format's in-process backend).
    `bisect_dir` (ONNX only; other formats ignore it): write the smallest subgraph
    that departs on its own there, with an `.npz` of its inputs and expected output.
    Raises `ArtifactError` when the export has no such artifact (or it fails its
    sha256 check), `InputSpecError` for inputs the model does not take.
    """
    if fmt_key not in exported.manifest.artifacts:
        raise ArtifactError(
            f"The manifest in {exported.dir} has no {fmt_key!r} artifact to localise; it has "
            f"{', '.join(exported.manifest.artifacts)}."
        )
    exported.entry.check_inputs(inputs)
    fmt = registry.get(fmt_key)
    name = backend or fmt.backend
    # The format says how (Format.localiser): its key is never branched on here.
    if fmt.localiser == "onnx":
        return _onnx(exported, inputs, atol, rtol, name, bisect_dir, fmt_key)
    if fmt.localiser == "torchscript":
        return _torchscript(exported, inputs, atol, rtol, name, fmt_key)
    return _unavailable(name, fmt.not_localised or f"no localiser for format {fmt_key!r}")


def _eager_calls(
    exported: ExportedModel, inputs: dict[str, torch.Tensor], args: bool
) -> list[Call]:
    try:
        return capture(exported.model, inputs, args=args)
    except Exception as err:  # noqa: BLE001 - the reference itself cannot run these inputs
        raise PipelineError(
            f"Eager {exported.name!r} fails on the inputs given to localise, so there is no "
            f"reference: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
        ) from None


# --- TorchScript ---------------------------------------------------------------


def _torchscript(
    exported: ExportedModel,
    inputs: dict[str, torch.Tensor],
    atol: float,
    rtol: float,
    name: str,
    key: str,
) -> Localisation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated; see DESIGN.md
        scripted = torch.jit.load(str(exported.path(key)), map_location="cpu").eval()
    # A loaded ScriptModule keeps the submodule tree (traced or scripted), each with
    # its own forward; freezing inlines them all into the top-level graph.
    compiled = dict(scripted.named_modules())
    eager_count = sum(1 for _ in exported.model.named_modules())
    if len(compiled) == 1 and eager_count > 1:
        how = exported.manifest.artifact(key).how
        return _unavailable(
            name,
            f"the TorchScript module ({how}) keeps none of the model's {eager_count - 1} "
            "submodules (frozen or inlined), so only its outputs can be compared",
        )
    compared, ran, missing, refused, departed = 0, 0, 0, 0, 0
    first: Divergence | None = None
    for call in _eager_calls(exported, inputs, args=True):
        part = compiled.get(call.path)
        if call.outputs is None:
            continue  # returned no tensors: nothing to compare
        if part is None:
            missing += 1
            continue
        try:
            with torch.no_grad():
                got = flatten_outputs(part(*call.args, **call.kwargs))
        except Exception:  # noqa: BLE001 - a part that cannot run alone is skipped, and counted
            refused += 1
            continue
        results = _compare_all(call.outputs, got, atol, rtol)
        ran += 1
        compared += len(results)
        bad = next((c for c in results if not c.passed), None)
        if bad is None:
            continue
        departed += 1
        if first is None:
            first = Divergence(
                call.path,
                type(call.module).__name__,
                call.path or "(root)",
                bad.max_abs,
                bad.max_rel,
                kind="TorchScript submodule",
                problem=problem(bad),
                detail="run alone on eager's inputs",
            )
    notes = [f"{departed} of {ran} module calls depart when run alone"] if first else []
    if missing:
        notes.append(f"{missing} module call(s) have no TorchScript submodule")
    if refused:
        notes.append(f"{refused} module call(s) could not run alone")
    if not ran:
        return _unavailable(name, "; ".join(["no TorchScript submodule could run alone", *notes]))
    return Localisation(name, True, first, compared, "; ".join(notes))


def _compare_all(
    expected: list[torch.Tensor], actual: list[torch.Tensor], atol: float, rtol: float
) -> list[Compared]:
    if len(expected) != len(actual):
        return [Compared.failed(Kind.MISSING, f"{len(actual)} outputs, eager has {len(expected)}")]
    return [compare(e, a, atol, rtol) for e, a in zip(expected, actual, strict=True)]


# --- ONNX ----------------------------------------------------------------------


def _first(
    pairs: list[Pair], calls: list[Call], got: dict[str, np.ndarray], atol: float, rtol: float
) -> tuple[tuple[Pair, Compared] | None, int]:
    """The first pair whose ONNX value departs from eager's, and how many depart."""
    first, departed = None, 0
    for pair in pairs:
        i, j, value = pair
        expected = calls[i].outputs[j]  # type: ignore[index]  # paired calls have outputs
        c = compare(expected, torch.from_numpy(got[value]), atol, rtol)
        if not c.passed:
            departed += 1
            first = first or (pair, c)
    return first, departed


def _onnx(
    exported: ExportedModel,
    inputs: dict[str, torch.Tensor],
    atol: float,
    rtol: float,
    name: str,
    bisect_dir: Path | None,
    key: str,
) -> Localisation:
    model = onnx.load(str(exported.path(key)))
    modules = dict(exported.model.named_modules())
    scopes = module_outputs(model, set(modules))
    if not scopes.scoped:
        how = exported.manifest.artifact(key).how
        return _unavailable(
            name,
            f"the ONNX graph ({how}) names no PyTorch module on its nodes, so its values cannot "
            "be matched to eager's",
        )
    calls = _eager_calls(exported, inputs, args=False)
    wanted = dict.fromkeys(v for c in calls if c.path for v in scopes.outputs.get(c.path, []))
    feed = graph_feed(model, inputs)
    try:
        # As it runs: every value carries the error of everything upstream.
        whole = run_marked(model, wanted, feed)
    except Exception as err:  # noqa: BLE001 - ORT refusing the marked graph is reported
        return _unavailable(
            name,
            f"ONNX Runtime could not run the graph with its intermediate values as outputs: {_brief(err)}",
        )
    # Sequences and strings have no eager tensor to match.
    whole = {k: v for k, v in whole.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    shapes = {k: (tuple(v.shape), torch.from_numpy(v).dtype) for k, v in whole.items()}
    graph_outputs = [o.name for o in model.graph.output]
    pairs = pair_outputs(calls, scopes, graph_outputs, shapes)
    if len(modules) > 1 and not any(calls[i].path for i, _, _ in pairs):
        return _unavailable(
            name, "no module's output could be found in the ONNX graph, only the model's outputs"
        )
    eager = {v: calls[i].outputs[j].numpy() for i, j, v in pairs}  # type: ignore[index]
    try:
        # Cut at every matched value: each value carries only its own nodes' error.
        alone = run_marked(
            cut_at(model, eager), eager, {**feed, **{EAGER_PREFIX + k: a for k, a in eager.items()}}
        )
    except Exception as err:  # noqa: BLE001 - as above
        return _unavailable(
            name, f"ONNX Runtime could not run the graph cut at eager's values: {_brief(err)}"
        )
    local, departed = _first(pairs, calls, alone, atol, rtol)
    carried, carried_count = _first(pairs, calls, whole, atol, rtol)
    notes = []
    if local is not None:
        notes.append(f"{departed} of {len(pairs)} values depart when computed from eager's inputs")
    elif carried is not None:
        (i, _, value), c = carried
        notes.append(
            f"no module departs on its own; rounding carried through the graph first exceeds "
            f"the tolerance at {calls[i].path or '(top level)'} (ONNX value {value!r}, max abs "
            f"err {c.max_abs:.1e}; {carried_count} of {len(pairs)} values)"
        )
    if local is None:
        return Localisation(name, True, None, len(pairs), "; ".join(notes))
    (i, _, value), c = local
    call = calls[i]
    node = scopes.producer.get(value)
    detail = ""
    if node is not None:
        detail = f"{node.op_type} node {node.name!r}"
        initializers = {t.name for t in model.graph.initializer}
        fused = fused_modules(node, call.path, initializers, modules)
        if fused:
            detail += f", which also computes {fused}: the exporter fused them"
    div = Divergence(
        call.path,
        type(call.module).__name__,
        value,
        c.max_abs,
        c.max_rel,
        problem=problem(c),
        detail=detail,
    )
    subgraph = None
    if bisect_dir is not None:
        known = {**feed, **{k: a for k, a in eager.items() if k != value}}
        found = isolate(
            model,
            value,
            known,
            eager[value],
            atol,
            rtol,
            Path(bisect_dir),
            f"{model_slug(exported.name)}_{call.path or 'model'}",
        )
        subgraph = found.path
        notes.append(f"bisect: {found.note}")
    return Localisation(name, True, div, len(pairs), "; ".join(notes), subgraph)


def _unavailable(backend: str, note: str) -> Localisation:
    return Localisation(backend, False, None, 0, note)


def _brief(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
