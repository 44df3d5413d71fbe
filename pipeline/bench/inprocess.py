"""In-process backends measured side by side, in interleaved rounds.

Every backend runs the same inputs (drawn once from the model's input spec).
A round measures each backend in turn, the order rotating from round to
round, so a noisy neighbour or a turbo change slows them all alike and the
ratios between them hold even when absolute figures drift. Each backend's
thread settings are explicit and recorded.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

# Suffix of the in-process twins of the single-threaded served workers: the
# same backend at one thread, so that served minus in-process is serving's cost.
ONE_THREAD = " (1 thread)"
# Fewest timed calls per backend and round when the time budget scales them down.
# Two, not five: resnet18 at batch 32 (seven backends, over a second a call) then
# gets two or three interleaved rounds in the budget; with five it got one round,
# in which a noisy moment lands on whichever backend it happens to hit.
MIN_RUNS = 2
# Warm-up stops after this long (at least MIN_WARMUP calls): ten warm-up calls of
# resnet18 at batch 32 took over ten seconds per backend. Two calls cover
# TorchScript's profiling run and the optimised graph it compiles on the second.
WARMUP_S = 2.0
MIN_WARMUP = 2


@dataclass
class Cell:
    model: str
    backend: str
    batch: int
    threads: int
    runs: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    throughput: float  # samples per second at the median latency
    gflops: float | None = None
    peak_fraction: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, row: dict[str, Any]) -> Cell:
        """A bench.json cell row back as a Cell (its extra keys, format and verified, left)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})


@dataclass
class Runner:
    """One backend: `measure(warmup, repeat)` returns one round's latency statistics (ms).

    `format` is the registry format it runs (what serving it means archiving);
    `verified_as` the verify report row whose pass vouches for it (a frozen
    TorchScript module is the TorchScript artifact, optimised in-process).
    """

    name: str
    measure: Callable[[int, int], dict[str, float]]
    settings: dict[str, Any] = field(default_factory=dict)
    format: str | None = None
    verified_as: str | None = None


def _stats(times_ms: list[float]) -> dict[str, float]:
    arr = np.asarray(times_ms)
    return {
        "runs": len(times_ms),
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "p99_ms": float(np.percentile(arr, 99)),
    }


def timed(fn: Callable[[], Any], threads: int | None = None) -> Callable[[int, int], dict]:
    """A measure() for a Python callable: `warmup` untimed calls (fewer when they pass
    WARMUP_S), then `repeat` timed ones."""

    def measure(warmup: int, repeat: int) -> dict[str, float]:
        previous = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                start = time.perf_counter()
                for i in range(warmup):
                    if i >= MIN_WARMUP and time.perf_counter() - start > WARMUP_S:
                        break
                    fn()
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
        finally:
            torch.set_num_threads(previous)
        return _stats(times)

    return measure


def model_flops(model: torch.nn.Module, inputs: list[torch.Tensor]) -> int:
    """FLOPs of one forward pass (matmuls and convolutions), by torch's flop counter."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        model(*inputs)
    return int(counter.get_total_flops())


def skipped(name: str, why: str | BaseException) -> Runner:
    """A backend left out before measuring, saying why (one line, at most 200 characters)."""
    if isinstance(why, BaseException):
        why = f"{type(why).__name__}: {why}"
    return Runner(name, _never, {"skipped": " ".join(why.split())[:200]})


def _never(warmup: int, repeat: int) -> dict[str, float]:
    raise RuntimeError("skipped")


# Untimed calls at the start of each round: the first call after another backend ran
# (the C++ client's process exiting, another library's threads still spinning) took
# milliseconds on the 2-core machine, so a round's p99 (of 30 calls, about its worst)
# was that one call: a .pt2 p99 of 8.7 ms against a p50 of 7 µs, where 1,500 calls in a
# row had a p99 of 9 µs. (At most the run's own warm-up: none when it asks for none.)
ROUND_WARMUP = 2


def measure_interleaved(
    runners: dict[str, Runner],
    *,
    warmup: int,
    repeat: int,
    rounds: int,
    time_budget_s: float | None = None,
) -> dict[str, list[dict[str, float]]]:
    """Per backend, one statistics dict per round; skipped backends are left out.

    With a time budget, a backend whose calls are slow (resnet18 at batch 32:
    about a second) runs fewer than `repeat` calls a round, never fewer than
    MIN_RUNS, so that the `rounds` fit in the budget: several interleaved
    rounds of fewer calls, rather than one long round that the budget ends.
    The budget is checked between rounds, so at the MIN_RUNS floor fewer
    rounds may run.

    A backend that fails (the C++ client refusing a format, say) is skipped from
    then on: its `settings["skipped"]` says why, and the others go on.
    """
    live = {n: r for n, r in runners.items() if "skipped" not in r.settings}
    call_s: dict[str, float] = {}
    for name in list(live):
        first = _run_or_skip(live, name, warmup, 1)  # lazy init etc. outside the rounds
        if first is not None:
            call_s[name] = first["p50_ms"] / 1e3
    names = list(live)
    runs = {n: repeat for n in names}
    if time_budget_s is not None and names:
        share_s = time_budget_s / rounds / len(names)
        floor = min(repeat, MIN_RUNS)
        runs = {n: max(floor, min(repeat, int(share_s / max(call_s[n], 1e-9)))) for n in names}
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    start = time.monotonic()
    for k in range(rounds if names else 0):
        order = names[k % len(names) :] + names[: k % len(names)]
        for name in (n for n in order if n in live):
            stats = _run_or_skip(live, name, min(ROUND_WARMUP, warmup), runs[name])
            if stats is not None:
                results[name].append(stats)
        if time_budget_s is not None and time.monotonic() - start > time_budget_s:
            break
    return {n: results[n] for n in names if n in live}


def _run_or_skip(
    live: dict[str, Runner], name: str, warmup: int, repeat: int
) -> dict[str, float] | None:
    try:
        return live[name].measure(warmup, repeat)
    except Exception as err:  # noqa: BLE001 - one failing backend must not end the bench
        why = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        log.warning("%s failed and is left out: %s", name, why)
        live.pop(name).settings["skipped"] = why
        return None


def cells(
    model: str,
    batch: int,
    threads: int,
    rounds: dict[str, list[dict[str, float]]],
    flops: int | None,
    peak_gflops: float | None,
    settings: dict[str, dict],
) -> list[Cell]:
    """One Cell per backend: the median over rounds of each round's statistics."""
    out = []
    for backend, per_round in rounds.items():
        median = statistics.median(r["p50_ms"] for r in per_round)
        gflops = flops / (median / 1e3) / 1e9 if flops else None
        out.append(
            Cell(
                model=model,
                backend=backend,
                batch=batch,
                threads=threads,
                runs=int(sum(r["runs"] for r in per_round)),
                median_ms=median,
                p90_ms=statistics.median(r["p90_ms"] for r in per_round),
                p99_ms=statistics.median(r["p99_ms"] for r in per_round),
                throughput=batch / (median / 1e3),
                gflops=gflops,
                peak_fraction=gflops / peak_gflops if gflops and peak_gflops else None,
                settings={**settings.get(backend, {}), "rounds": len(per_round)},
            )
        )
    return out
