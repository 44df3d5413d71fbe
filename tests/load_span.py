"""Load runs back to back in a thread while a test rolls versions out and back: every
answer checked against eager of the version that gave it (loadtest's `store`)."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

from pipeline.serving import versions
from pipeline.serving.loadreport import LoadReport
from pipeline.serving.loadtest import LoadConfig, run
from pipeline.serving.rollout import Bounds, RolloutConfig
from pipeline.serving.server import Server

# The bounds of a rollout test that checks what is lost, not how fast the canary is: its
# error rate is judged as by default, its p99 against the default version's is not. Two
# other xdist workers share the 2 cores, and a p99 of the few dozen requests a one-second
# watch sees swung past the default's 3× in full runs (25.7 ms against 6.95). The latency
# bound has a test of its own that must trip it (test_rollout.py's
# test_a_canary_past_its_bound_rolls_back_by_itself).
LATENCY_UNJUDGED = Bounds(max_p99_ratio=math.inf)


def as_canary(run_dir: Path, store: Path, percent: float, watch_s: float) -> RolloutConfig:
    """Version 2 of digits_lenet as a canary, its latency unjudged (LATENCY_UNJUDGED)."""
    return RolloutConfig("digits_lenet", run_dir, version=2, store=store, canary=percent,
                         watch_s=watch_s, bounds=LATENCY_UNJUDGED)  # fmt: skip


class LoadSpan:
    """Load runs back to back in a thread until stopped: the whole span is checked."""

    def __init__(self, server: Server, store: Path, model: str = "digits_lenet") -> None:
        self.config = LoadConfig(
            export_dir=versions.get(model, 1, store).dir, run_dir=Path(server.run_dir),
            requests=400, concurrency=4, pool=16, store=store, retries=0,
        )  # fmt: skip
        self.reports: list[LoadReport] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.done.is_set():
            self.reports.append(run(self.config))

    def __enter__(self) -> LoadSpan:
        self.thread.start()
        while not self.reports:  # one whole run before the test moves anything
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=120)

    def answered(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for r in self.reports:
            for v, n in r.by_version.items():
                total[v] = total.get(v, 0) + n
        return total

    def check_nothing_lost(self) -> None:
        for r in self.reports:
            assert (r.failed, r.server_errors, r.wrong, r.not_sent) == (0, 0, 0, 0), r.summary()
