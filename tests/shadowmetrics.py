"""The live shadow check's counters, as a test reads them from a server's Prometheus
text (the KServe runtime's /metrics, TorchServe's metrics port) once the check has
accounted for every sampled request."""

from __future__ import annotations

import re
import time

import httpx

KINDS = ("checked", "diverged", "dropped", "failed")


def counts(url: str, labels: str, sent: float, timeout_s: float) -> dict[str, float]:
    """`pipeline_shadow_<kind>_total` summed over the series whose labels match `labels`
    (a regex for what is inside the braces), polled until checked + dropped + failed
    reach `sent` or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(url, timeout=10).text
        got = {
            k: sum(float(v) for v in re.findall(
                rf"^pipeline_shadow_{k}_total\{{{labels}\}} (\S+)$", text, re.M))
            for k in KINDS
        }  # fmt: skip
        if got["checked"] + got["dropped"] + got["failed"] >= sent or time.monotonic() > deadline:
            return got
        time.sleep(0.2)
