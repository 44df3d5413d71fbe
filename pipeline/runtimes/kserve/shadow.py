"""`pipeline serve --runtime kserve --shadow RATE`: a live check of the answers (issue 41).

Each worker samples RATE of its answered requests and hands them, with their answers,
to a reference process of its own (pipeline.serving.shadowref, started with
multiprocessing's spawn: a fresh interpreter, so this worker stays torch-free) through a
bounded queue: a sample that does not fit is dropped and counted, never waited for. The
verdicts come back on a second queue, which a task of the worker's event loop drains
into the metrics below; with several workers they are summed in /metrics like the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import queue
import random
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import Counter, Histogram

from pipeline.serving.shadowref import READY, Sample, run

log = logging.getLogger("pipeline.runtimes.kserve")

LABELS = ["model_name", "version", "format"]
CHECKED = Counter("pipeline_shadow_checked_total", "Sampled answers checked against eager", LABELS)
DIVERGED = Counter(
    "pipeline_shadow_diverged_total", "Checked answers outside the export's own rule", LABELS
)
DROPPED = Counter(
    "pipeline_shadow_dropped_total", "Sampled answers dropped: the check's queue was full", LABELS
)
FAILED = Counter(
    "pipeline_shadow_failed_total", "Samples whose check could not run (no reference)", LABELS
)
SHARE = Histogram(
    "pipeline_shadow_error_share",
    "Each checked answer's error as a share of its allowance (1: at the bound)",
    ["model_name", "format"],
    buckets=(0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 10.0, 100.0),
)
QUEUE_SIZE = 32  # samples waiting for the reference at most


class Shadow:
    """One worker's sampler and its reference process."""

    def __init__(
        self,
        rate: float,
        run_dir: Path,
        max_rate: float,
        export_dirs: tuple[str, ...] = (),
        threads: int = 1,
        timeout_s: float = 300.0,
    ) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"--shadow must be in (0, 1], got {rate}")
        self.rate = rate
        context = multiprocessing.get_context("spawn")
        self.samples: Any = context.Queue(QUEUE_SIZE)
        self.verdicts: Any = context.Queue()
        self.process = context.Process(
            target=run,
            args=(self.samples, self.verdicts, str(run_dir), max_rate, threads, export_dirs),
            name="shadow-reference",
            daemon=True,
        )
        self.process.start()
        # Before this worker serves: the reference's start (torch, the eager models) would
        # otherwise take the CPU from the first seconds of serving.
        try:
            said = self.verdicts.get(timeout=timeout_s)
        except queue.Empty:
            said = None
        if said != READY:
            self.process.kill()
            raise RuntimeError(f"the shadow check's reference process did not start ({said!r})")
        self.draining: asyncio.Task[None] | None = None
        log.info(
            "shadow check: %.3g of requests, at most %g a second (pid %d)",
            rate,
            max_rate,
            self.process.pid,
        )

    def known(self, model: Any) -> None:
        """Start `model`'s series at 0 (Prometheus's advice: a process initialises the label
        sets it knows it will use), so an alert on divergences has a series to read on a
        healthy server, as TorchServe's handler has from its start."""
        labels = (model.name, str(model.version), model.format)
        for counter in (CHECKED, DIVERGED, DROPPED, FAILED):
            counter.labels(*labels)

    def offer(
        self,
        model: Any,
        arrays: dict[str, np.ndarray],
        outputs: list[np.ndarray],
        request_id: str,
        trace_id: str,
    ) -> None:
        """A request just answered by `model` (models.ExportModel): sampled at RATE."""
        if self.rate < 1 and random.random() >= self.rate:
            return
        if self.draining is None:  # started lazily: there is no loop before the server runs
            self.draining = asyncio.get_running_loop().create_task(self._drain())
        sample = Sample(
            model.name,
            model.version,
            model.format,
            model.export_dir,
            arrays,
            outputs,
            request_id,
            trace_id,
        )
        try:
            self.samples.put_nowait(sample)
        except queue.Full:
            DROPPED.labels(model.name, str(model.version), model.format).inc()

    async def _drain(self) -> None:
        while True:
            for _ in range(256):
                try:
                    v = self.verdicts.get_nowait()
                except queue.Empty:
                    break
                labels = (v.model, str(v.version), v.format)
                if v.error:
                    FAILED.labels(*labels).inc()
                    continue
                CHECKED.labels(*labels).inc()
                SHARE.labels(v.model, v.format).observe(v.share)
                if v.diverged:
                    DIVERGED.labels(*labels).inc()
            await asyncio.sleep(0.2)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.samples.put_nowait(None)
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
