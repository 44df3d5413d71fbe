"""The server's own split of a served row's time (issue 40, point 3).

Around each served level, bench reads the server's stage totals before and after,
each runtime's /metrics read by its own `BenchReport.split` (the KServe runtime's
stage histograms, summed over its workers; TorchServe's frontend queue and inference
counters); the difference per request is where the server spent the
row's time, and what the client measured beyond it is the rest: the HTTP framing, the
kernel's loopback and the client itself. Each served name's window starts when its
measured requests do, after its warm-up (bench.load's `_warmed`): the split is a mean
over the row's own requests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx

from pipeline.serving.server import Server

log = logging.getLogger(__name__)

# The stages a server may report, in the order a split is printed: the KServe runtime's
# histograms, and TorchServe's "backend" (the worker's round trip, handler included).
STAGES = ("decode", "queue", "compute", "encode")
ORDER = (*STAGES, "backend")

# (served name, stage) → (seconds summed, requests counted)
Totals = dict[tuple[str, str], tuple[float, float]]
Probe = Callable[[], Totals]


def scraper(server: Server, read: Callable[[str], Totals]) -> Probe:
    """A probe of `server`'s /metrics, read by `read` (its runtime's `BenchReport.split`;
    empty when it cannot be read)."""

    def probe() -> Totals:
        url = f"{server.metrics_url}/metrics"
        try:
            answer = httpx.get(url, timeout=10)
            answer.raise_for_status()
            return read(answer.text)
        except (httpx.HTTPError, ValueError) as err:  # unreachable, refused, not Prometheus
            log.warning("no server split: %s: %s", url, " ".join(str(err).split())[:200])
            return {}

    return probe


def between(before: Totals, after: Totals, name: str, mean_ms: float) -> dict[str, Any] | None:
    """Per request, in ms: each stage, the server's total and the client's remainder
    (`mean_ms`, the row's mean latency, less the server's). None: no stage counted."""
    out: dict[str, Any] = {}
    for stage in (s for s in ORDER if (name, s) in after):
        s1, c1 = after[(name, stage)]
        s0, c0 = before.get((name, stage), (0.0, 0.0))
        if c1 - c0 <= 0:
            return None
        out[stage] = round((s1 - s0) / (c1 - c0) * 1e3, 4)
        out["requests"] = int(c1 - c0)
    if not out:
        return None
    out["server"] = round(sum(out[s] for s in ORDER if s in out), 4)
    out["client_and_http"] = round(mean_ms - out["server"], 4)
    return out


def describe(split: dict[str, Any] | None) -> str:
    """One line: 'decode 0.02 + queue 0.01 + compute 0.05 + encode 0.01 = 0.09 ms server; 0.3 ms client and HTTP'."""
    if not split:
        return ""
    stages = " + ".join(f"{s} {split[s]:.3f}" for s in ORDER if s in split)
    return f"{stages} = {split['server']:.3f} ms in the server; {split['client_and_http']:.3f} ms client and HTTP"
