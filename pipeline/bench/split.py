"""The server's own split of a served row's time (issue 40, point 3).

Around each served level, bench reads the server's stage histograms (the KServe
runtime's `pipeline_kserve_{decode,queue,compute,encode}_seconds`, summed over its
workers) before and after; the difference per request is where the server spent the
row's time, and what the client measured beyond it is the rest: the HTTP framing, the
kernel's loopback and the client itself. The window includes the level's warm-up
requests, so the split is a mean over slightly more requests than the row's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pipeline.serving.server import Server

log = logging.getLogger(__name__)

STAGES = ("decode", "queue", "compute", "encode")
PREFIX = "pipeline_kserve_"

# (served name, stage) → (seconds summed, requests counted)
Totals = dict[tuple[str, str], tuple[float, float]]
Probe = Callable[[], Totals]


def parse(text: str) -> Totals:
    """The stage histograms' sums and counts in a Prometheus text scrape."""
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        stage = family.name.removeprefix(PREFIX).removesuffix("_seconds")
        if not family.name.startswith(PREFIX) or stage not in STAGES:
            continue
        for sample in family.samples:
            key = (sample.labels.get("model_name", ""), stage)
            if sample.name.endswith("_sum"):
                sums[key] = sums.get(key, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                counts[key] = counts.get(key, 0.0) + sample.value
    return {k: (sums.get(k, 0.0), counts.get(k, 0.0)) for k in sums.keys() | counts.keys()}


def scraper(server: Server) -> Probe:
    """A probe of `server`'s /metrics (empty totals when it cannot be read)."""

    def probe() -> Totals:
        try:
            return parse(httpx.get(f"{server.metrics_url}/metrics", timeout=10).text)
        except httpx.HTTPError as err:
            log.warning("no server split: %s/metrics: %s", server.metrics_url, err)
            return {}

    return probe


def between(before: Totals, after: Totals, name: str, mean_ms: float) -> dict[str, Any] | None:
    """Per request, in ms: each stage, the server's total and the client's remainder
    (`mean_ms`, the row's mean latency, less the server's). None: no stage counted."""
    out: dict[str, Any] = {}
    for stage in STAGES:
        s1, c1 = after.get((name, stage), (0.0, 0.0))
        s0, c0 = before.get((name, stage), (0.0, 0.0))
        if c1 - c0 <= 0:
            return None
        out[stage] = round((s1 - s0) / (c1 - c0) * 1e3, 4)
    out["server"] = round(sum(out[s] for s in STAGES), 4)
    out["client_and_http"] = round(mean_ms - out["server"], 4)
    out["requests"] = int(after[(name, "decode")][1] - before.get((name, "decode"), (0, 0))[1])
    return out


def describe(split: dict[str, Any] | None) -> str:
    """One line: 'decode 0.02 + queue 0.01 + compute 0.05 + encode 0.01 = 0.09 ms server; 0.3 ms client and HTTP'."""
    if not split:
        return ""
    stages = " + ".join(f"{s} {split[s]:.3f}" for s in STAGES)
    return f"{stages} = {split['server']:.3f} ms in the server; {split['client_and_http']:.3f} ms client and HTTP"
