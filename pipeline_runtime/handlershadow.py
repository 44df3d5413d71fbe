"""The TorchServe handler's side of `pipeline serve --runtime torchserve --shadow RATE`
(issue 41): a sample of the answered requests, re-run on eager PyTorch beside the worker.

`pipeline serve` puts the settings into TorchServe's environment, which its workers
inherit (pipeline.runtimes.torchserve.shadow): the rate, the reference's most samples a
second, the run folder, and which export each served model was archived from. With
them, each worker starts a reference process of its own (pipeline.serving.shadowref, the
KServe runtime's) before it serves, and offers it each answered request with probability
RATE through a bounded queue: a sample that does not fit is dropped and counted, never
waited for. A thread of the worker turns the verdicts into TorchServe custom metrics
(`context.metrics`), which TorchServe's Prometheus endpoint sums over the workers.

Unlike the rest of pipeline_runtime, the check needs the `pipeline` package (the
reference loads the export's checkpoint). This package never imports it: serve names the
reference's entry point in the environment too, and only a worker with the check on
loads it (`pipeline serve` runs TorchServe from the environment `pipeline` is in).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import multiprocessing
import os
import queue
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline_runtime import codec
from pipeline_runtime.manifest import Manifest
from pipeline_runtime.shadowwire import READY, Sample
from pipeline_runtime.tracing import TRACEPARENT

logger = logging.getLogger(__name__)

RATE_ENV = "PIPELINE_SHADOW_RATE"
MAX_RATE_ENV = "PIPELINE_SHADOW_MAX_RATE"
RUN_DIR_ENV = "PIPELINE_SHADOW_RUN_DIR"
REFERENCE_ENV = "PIPELINE_SHADOW_REFERENCE"  # "module:function": the reference's loop
# JSON: served model name → the export folders that may hold its artifact (the one serve
# checked first; then the model's published versions, for a version a rollout registers).
EXPORTS_ENV = "PIPELINE_SHADOW_EXPORTS"
ENVIRONMENT = (RATE_ENV, MAX_RATE_ENV, RUN_DIR_ENV, REFERENCE_ENV, EXPORTS_ENV)

QUEUE_SIZE = 32  # samples waiting for the reference at most (as the KServe runtime's)
READY_TIMEOUT_S = 180.0  # torch's import and the eager model, on a busy machine
KINDS = ("checked", "diverged", "dropped", "failed")
# The KServe runtime's label names, so one alert rule reads both runtimes' metrics.
LABELS = ["model_name", "version", "format"]
SHARE = "pipeline_shadow_error_share"
# TorchServe's frontend parses the value with Java's Double.parseDouble, which takes no
# "inf": an answer of the wrong shape or not finite is recorded past the last bucket.
SHARE_CAP = 1e9


def counter_name(kind: str) -> str:
    return f"pipeline_shadow_{kind}_total"


class ShadowCheck:
    """One worker's sampler and verdict tally. `samples` and `verdicts`: the queues to and
    from its reference process; `metrics`: TorchServe's `context.metrics`."""

    def __init__(
        self,
        rate: float,
        model: str,
        version: int,
        fmt: str,
        export_dir: str,
        samples: Any,
        verdicts: Any,
        metrics: Any,
        draw: Callable[[], float] = random.random,
    ) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        self.rate, self.draw = rate, draw
        self.model, self.version, self.format, self.export_dir = model, version, fmt, export_dir
        self.samples, self.verdicts = samples, verdicts
        self.labels = [model, str(version), fmt]
        self.counters = {
            kind: metrics.add_metric_to_cache(
                counter_name(kind), "count", list(LABELS), MetricTypes.COUNTER
            )
            for kind in KINDS
        }
        self.share = metrics.add_metric_to_cache(
            SHARE, "share", ["model_name", "format"], MetricTypes.HISTOGRAM
        )
        for kind in KINDS:  # every series on /metrics from the start: diverged 0 is news
            self.count(kind, 0)

    def count(self, kind: str, n: int = 1) -> None:
        self.counters[kind].add_or_update(n, self.labels)

    def offer_results(self, results: list[Any], context: Any) -> None:
        """The handler's `inference` results: each answered request, sampled at RATE."""
        for idx, item in enumerate(results):
            if isinstance(item, codec.RequestError) or self.draw() >= self.rate:
                continue
            decoded, outputs = item
            self.offer(decoded.arrays, outputs, *_ids(context, idx))

    def offer(
        self,
        inputs: dict[str, np.ndarray],
        outputs: list[np.ndarray],
        request_id: str = "",
        trace_id: str = "",
    ) -> None:
        """One answered request to the reference, unless its queue is full (counted)."""
        sample = Sample(
            self.model,
            self.version,
            self.format,
            self.export_dir,
            inputs,
            outputs,
            request_id,
            trace_id,
        )
        try:
            self.samples.put_nowait(sample)
        except queue.Full:
            self.count("dropped")

    def record(self, verdict: Any) -> None:
        if verdict.error:
            self.count("failed")
            return
        self.count("checked")
        share = verdict.share if math.isfinite(verdict.share) else SHARE_CAP
        self.share.add_or_update(min(share, SHARE_CAP), [self.model, self.format])
        if verdict.diverged:
            self.count("diverged")

    def drain(self, timeout_s: float) -> int:
        """Record the verdicts that came back (waiting up to `timeout_s` for the first);
        how many."""
        done, wait = 0, timeout_s
        while True:
            try:
                verdict = (
                    self.verdicts.get(timeout=wait) if wait > 0 else self.verdicts.get_nowait()
                )
            except queue.Empty:
                return done
            self.record(verdict)
            done, wait = done + 1, 0.0

    def drain_while(self, alive: Callable[[], bool]) -> None:
        """The worker's verdict thread: verdicts to metrics as they come, while the
        reference lives."""
        while True:
            try:
                self.drain(timeout_s=1.0)
            except (EOFError, OSError):  # the queue's pipe closed: the reference is gone
                break
            if not alive():
                break
        logger.warning(
            "shadow check of %s: the reference process exited; later samples are "
            "dropped (pipeline_shadow_dropped_total)",
            self.model,
        )


def _ids(context: Any, idx: int) -> tuple[str, str]:
    """TorchServe's request id (its answer's x-request-id) and the W3C trace id, if any."""
    request_id = trace_id = ""
    try:
        request_id = str(context.get_request_id(idx) or "")
        parent = context.get_request_header(idx, TRACEPARENT) or ""
        parent = parent.decode() if isinstance(parent, bytes) else str(parent)
        parts = parent.split("-")
        trace_id = parts[1] if len(parts) == 4 else ""
    except (AttributeError, IndexError, KeyError, TypeError):
        pass
    return request_id, trace_id


def _manifest(export_dir: str) -> Manifest | None:
    try:
        return Manifest.read(Path(export_dir))
    except (OSError, ValueError):
        return None


def _reference_dir(handler: Any, candidates: list[str]) -> str | None:
    """The export to check this worker's answers against: the one holding its artifact
    (by sha256), else, for an artifact changed after export (a file altered where
    TorchServe unpacked it, then resealed), the one exported from the same checkpoint:
    such a file is what the check exists to catch, so it is checked, not let off."""
    record = handler.contract.artifact(handler.format_key)
    read = [(d, m) for d in candidates if (m := _manifest(d)) is not None]
    for export_dir, manifest in read:
        held = manifest.artifacts.get(handler.format_key)
        if held is not None and held.sha256 == record.sha256:
            return export_dir
    checkpoint = handler.contract.checkpoint.sha256
    found = next((d for d, m in read if m.checkpoint.sha256 == checkpoint), None)
    if found is not None:
        logger.warning(
            "shadow check of %s: its %s (sha256 %s…) is not the file %s holds; "
            "checking it against that export's eager model (same checkpoint)",
            handler.model_name,
            record.file,
            record.sha256[:12],
            found,
        )
    return found


def _version(context: Any) -> int:
    """The archive's TorchServe model version as a number ("1.0" → 1; else 1)."""
    try:
        return int(float(context.manifest["model"]["modelVersion"]))
    except (AttributeError, KeyError, TypeError, ValueError):
        return 1


def install(handler: Any, context: Any) -> ShadowCheck | None:
    """With the check on: this worker's reference started (READY) and its `inference`
    offering samples; None when off."""
    rate = float(os.environ.get(RATE_ENV) or 0)
    if rate <= 0:
        return None
    candidates = json.loads(os.environ.get(EXPORTS_ENV) or "{}").get(handler.model_name, [])
    export_dir = _reference_dir(handler, candidates)
    if export_dir is None:  # serve checked the archives it started: a later registration
        record = handler.contract.artifact(handler.format_key)
        logger.warning(
            "shadow check off for %s: none of %s holds its %s (sha256 %s…) or "
            "was exported from its checkpoint",
            handler.model_name,
            candidates,
            record.file,
            record.sha256[:12],
        )
        return None
    run = _reference()
    max_rate = float(os.environ.get(MAX_RATE_ENV) or 20)
    spawn = multiprocessing.get_context("spawn")  # never fork a worker holding a model
    samples, verdicts = spawn.Queue(QUEUE_SIZE), spawn.Queue()
    process = spawn.Process(
        target=run,
        args=(
            samples,
            verdicts,
            os.environ.get(RUN_DIR_ENV) or os.getcwd(),
            max_rate,
            1,
            (export_dir,),
        ),
        name="shadow-reference",
        daemon=True,
    )
    process.start()
    try:  # before this worker serves: the reference's start would take its CPU
        said = verdicts.get(timeout=READY_TIMEOUT_S)
    except queue.Empty:
        said = None
    if said != READY:
        process.kill()
        raise RuntimeError(f"the shadow check's reference process did not start ({said!r})")
    check = ShadowCheck(
        rate,
        handler.model_name,
        _version(context),
        handler.format_key,
        export_dir,
        samples,
        verdicts,
        context.metrics,
    )
    threading.Thread(
        target=check.drain_while, args=(process.is_alive,), daemon=True, name="shadow-verdicts"
    ).start()
    handler.inference = _offering(handler.inference, check, handler)
    logger.info(
        "shadow check: %.3g of requests, at most %g a second, against %s (pid %d)",
        rate,
        max_rate,
        export_dir,
        process.pid,
    )
    return check


def _reference() -> Callable[..., Any]:
    """The reference process's loop, as serve named it ("module:function")."""
    entry = os.environ.get(REFERENCE_ENV, "")
    module, _, name = entry.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise RuntimeError(
            f"the shadow check's reference {entry!r} ({REFERENCE_ENV}) cannot be loaded in this "
            f"worker: {err}. TorchServe must run from the environment `pipeline` is installed in."
        ) from None


def _offering(step: Callable[..., Any], check: ShadowCheck, handler: Any) -> Callable[..., Any]:
    def run(data: Any, *args: Any, **kwargs: Any) -> Any:
        results = step(data, *args, **kwargs)
        try:
            check.offer_results(results, handler.context)
        except Exception:  # a check's bug is logged, never the request's failure
            logger.exception("shadow check of %s: a sample was not offered", check.model)
        return results

    return run
