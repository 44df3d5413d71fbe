"""How a load run holds the answers of an int8 or float16 format.

A float32 format's answer is held to eager elementwise, within the manifest's tolerance
(pipeline.serving.loadtest). A reduced-precision one cannot be: it differs from eager by
its quantisation (export's and verify's task-level verdict, pipeline.core.tasklevel), and
where the server stacks requests into one forward pass a dynamically quantised artifact's
activation scales follow its batch peers (measured on the digits CNN's int8 ONNX: logits
differ by up to 7e-3 between an input alone and stacked with seven others), so not even
the artifact's own in-process answer can be matched elementwise.

Its answers are pooled instead and held to the signal-to-quantisation-noise ratio export
and verify hold every reduced format's scores to (the budget export recorded, else the
precision's minimum), one verdict per output. Top-1 agreement is reported, not judged:
the run's random inputs are too few to resolve an accuracy budget in points (one
disagreement among the default 64 is 1.6 points; the digits CNN's int8 ONNX agrees on
61 of 64 random inputs, at 36 dB).

With --by-version each answer is held to eager of the version it names (`ByVersion`),
whose folder is opened when that version first answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.core.budget import Budget
from pipeline.core.errors import PipelineError
from pipeline.core.tasklevel import judge_cases
from pipeline.core.verdict import SQNR, Verdict
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry

KEPT = 1024  # answers pooled for the verdict: enough values, bounded memory on long runs


@dataclass
class PooledAnswers:
    """The answers of one reduced-precision served format beside eager's outputs."""

    fmt: str
    precision: str
    names: list[str]
    budget: Budget
    pairs: list[tuple[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]]] = field(
        default_factory=list
    )

    def add(self, expected: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor]) -> str:
        """Keep one answer (the first KEPT); "" when it has every output in eager's shape,
        else what is wrong with it (an answer counted wrong at once)."""
        for name in self.names:
            if name not in got:
                return f"output {name!r} missing"
            if tuple(got[name].shape) != tuple(expected[name].shape):
                return (
                    f"output {name!r} has shape {tuple(got[name].shape)}, eager's "
                    f"{tuple(expected[name].shape)}"
                )
        if len(self.pairs) < KEPT:
            self.pairs.append((expected, got))
        return ""

    def reset(self) -> None:
        """Forget the answers kept so far (the warm-up's)."""
        self.pairs.clear()

    def verdicts(self) -> list[Verdict]:
        """One SQNR verdict per output over the kept answers (none when nothing answered)."""
        if not self.pairs:
            return []
        eager = iter([e for e, _ in self.pairs])
        answers = iter([g for _, g in self.pairs])
        cases = [(f"answer {i}", {}) for i in range(len(self.pairs))]
        return judge_cases(
            SQNR,
            lambda _: next(eager),
            lambda _: next(answers),
            cases,
            self.names,
            self.precision,
            self.budget,
        )

    def agreement(self) -> float | None:
        """Top-1 agreement with eager of a classifier's first output (reported only)."""
        first = self.names[0]
        ref = [e[first] for e, _ in self.pairs]
        got = [g[first] for _, g in self.pairs]
        if not ref or any(r.ndim != 2 or r.shape[1] < 2 for r in ref):
            return None
        return float((torch.cat(ref).argmax(1) == torch.cat(got).argmax(1)).double().mean())


def pooled_for(exported: ExportedModel, fmt: str | None) -> PooledAnswers | None:
    """A pool for served format `fmt` when it is a reduced-precision one; None for float32
    (or a format this registry does not know: held elementwise, as before)."""
    if fmt is None or fmt not in list(registry.keys()):
        return None
    precision = registry.precision_of(fmt)
    if precision == registry.FLOAT32:
        return None
    record = exported.manifest.artifacts.get(fmt)
    budget = Budget.from_json(record.get("budget") if record else None)
    return PooledAnswers(fmt, precision, list(exported.manifest.output_names), budget)


Outputs = list[dict[str, torch.Tensor]]


class UncheckedVersionError(Exception):
    """An answer's version has no eager outputs to hold it to: the store does not hold it,
    or its folder cannot be opened (the message says which)."""


class ByVersion:
    """The eager outputs of a load run's inputs, by the version that answers (--by-version).

    A version's folder is opened when that version first answers, not before: opening
    every folder of the store at start ended the run on a broken folder of a version the
    server never served (a user's copy of another model's export as version 3). Without
    a store, or for an answer that names no version, `exported`'s outputs."""

    def __init__(self, exported: ExportedModel, inputs: list, store: Path | None) -> None:
        self.model, self.inputs, self.store = exported.name, inputs, store
        self._known: dict[str | None, Outputs | str] = {None: [exported.eager(x) for x in inputs]}
        self._locks: dict[str, asyncio.Lock] = {}

    async def of(self, named: str | None) -> Outputs:
        """The outputs an answer of version `named` must match; UncheckedVersionError when none
        can be had. Computed once per version, off the event loop (an export's eager runs)."""
        if self.store is None or named is None:
            named = None
        elif named not in self._known:
            async with self._locks.setdefault(named, asyncio.Lock()):
                if named not in self._known:
                    self._known[named] = await asyncio.to_thread(self._eager_of, named)
        found = self._known[named]
        if isinstance(found, str):
            raise UncheckedVersionError(found)
        return found

    def _eager_of(self, named: str) -> Outputs | str:
        from pipeline.serving import versions

        assert self.store is not None  # of() asks only with a store
        held = {str(v.number): v for v in versions.versions(self.model, self.store)}
        if named not in held:
            return f"version {named}, which {self.store} does not hold, answered"
        try:
            opened = held[named].open()
        except (PipelineError, OSError, ValueError) as err:
            return f"version {named} answered, but its folder cannot be opened to check it: {err}"
        return [opened.eager(x) for x in self.inputs]
