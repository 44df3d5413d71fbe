"""The server's own split of a served row's time (issue 40, point 3).

Around each served level, bench reads the server's stage totals (the KServe
runtime's `pipeline_kserve_{decode,queue,compute,encode}_seconds`, summed over its
workers; TorchServe's frontend queue and inference counters) before and after; the difference per request is where the server spent the
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

STAGES = ("decode", "queue", "compute", "encode")  # the KServe runtime's histograms
# TorchServe's frontend counters (RestJob): both start when the frontend takes the
# request, so "backend" is inference less queue: the worker's round trip, handler included.
TS_QUEUE, TS_INFERENCE = "ts_queue_latency_microseconds", "ts_inference_latency_microseconds"
TS_REQUESTS = "ts_inference_requests"  # its samples: ..._total
ORDER = (*STAGES, "backend")
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


def parse_torchserve(text: str) -> Totals:
    """TorchServe's per-model queue and backend time, from its frontend counters (µs)."""
    by: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):  # counters: by family name
        if family.name not in (TS_QUEUE, TS_INFERENCE, TS_REQUESTS):
            continue
        for sample in family.samples:
            model = by.setdefault(sample.labels.get("model_name", ""), {})
            model[family.name] = model.get(family.name, 0.0) + sample.value
    out: Totals = {}
    for name, got in by.items():
        n, queue = got.get(TS_REQUESTS, 0.0), got.get(TS_QUEUE, 0.0) / 1e6
        out[(name, "queue")] = (queue, n)
        out[(name, "backend")] = (got.get(TS_INFERENCE, 0.0) / 1e6 - queue, n)
    return out


def scraper(server: Server, read: Callable[[str], Totals] = parse) -> Probe:
    """A probe of `server`'s /metrics, read by `read` (empty when it cannot be read)."""

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
