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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from pipeline.core.budget import Budget
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
