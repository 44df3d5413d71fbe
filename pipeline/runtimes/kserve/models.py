"""The KServe runtime's served models: one export version (`ExportModel`) and its checks.

Import after kserve (runtime.py hides sys.argv from kserve's import).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import kserve
import numpy as np
from kserve.errors import InvalidInput
from prometheus_client import Counter, Gauge, Histogram

from pipeline.core.errors import PipelineError
from pipeline.runtimes.kserve import binary
from pipeline.runtimes.kserve.batching import Batcher
from pipeline.runtimes.kserve.config import RuntimeConfig, ServedExport
from pipeline.runtimes.kserve.fastpath import ClientError
from pipeline.serving import loading
from pipeline_runtime import bounded, codec, oip, tracing
from pipeline_runtime.asked import unbatch
from pipeline_runtime.request import MAX_SAMPLES_ENV, SAMPLES_PER_BATCH

log = logging.getLogger("pipeline.runtimes.kserve")

BATCH_SIZE = Histogram(
    "pipeline_kserve_batch_size",
    "Requests per forward pass (dynamic batching)",
    ["model_name"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
# The server's own split of a request's time, per model and format (Triton's
# perf_analyzer splits the same way): decode (body to checked arrays), queue (waiting
# for the model), compute (the forward pass it was part of) and encode (the answer).
_STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
STAGES = {
    stage: Histogram(
        f"pipeline_kserve_{stage}_seconds", what, ["model_name", "format"], buckets=_STAGE_BUCKETS
    )
    for stage, what in (
        ("decode", "Request body to checked input arrays"),
        ("queue", "Waiting in the batcher's queue for a forward pass"),
        ("compute", "The forward pass the request was part of"),
        ("encode", "Outputs to the answer's body"),
    )
}
# Which worker ran them: with the workers' metrics summed (supervisor.py), the one series
# that tells them apart. SLOT is this process's (runtime.serve sets it; "0" alone).
FORWARD_PASSES = Counter(
    "pipeline_kserve_forward_passes_total",
    "Forward passes (batches), by model and by the worker slot that ran them",
    ["model_name", "slot"],
)
SLOT = "0"
SHADOW: Any = None  # this worker's shadow check (shadow.Shadow), when --shadow asks for one
WARMED = Gauge(
    "pipeline_kserve_warmed_up",
    "1 once the model ran its warm-up (on every live worker)",
    ["model_name"],
    multiprocess_mode="livemin",
)


def max_samples(max_batch_size: int) -> int:
    """How many samples one request may carry: `PIPELINE_MAX_SAMPLES` in the server's
    environment (the workers inherit it), else `SAMPLES_PER_BATCH` times the batch size.
    The TorchServe handler's rule (pipeline_runtime.handler.max_samples), which imports
    torch; the KServe runtime may serve without it (ONNX)."""
    value = os.environ.get(MAX_SAMPLES_ENV, "")
    if value == "":
        return SAMPLES_PER_BATCH * max(1, max_batch_size)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:  # a server that cannot start says why, rather than serving another limit
        raise PipelineError(
            f"{MAX_SAMPLES_ENV} must be a whole number of samples, at least 1; got {value!r}."
        )
    return n


class Refused(InvalidInput, ClientError):  # noqa: N818 - the name tests and docs use
    """A client error with its own HTTP status (413 for too many samples); gRPC: INVALID_ARGUMENT.
    kserve's routes know it as InvalidInput, the fast REST route as ClientError."""

    def __init__(self, reason: str, status: int = 400) -> None:
        InvalidInput.__init__(self, reason)
        self.status = status


class ExportModel(kserve.Model):
    """One export, served under `served.name` (as `served.version` of it, when published).
    `inflight` counts the requests running on it: a version taken out of service is dropped
    only once it is 0."""

    def __init__(self, served: ServedExport, config: RuntimeConfig) -> None:
        super().__init__(served.name)
        self.version = served.version or 1  # an unpublished export answers as version 1
        # First: a bad PIPELINE_MAX_SAMPLES stops the start before any model is loaded.
        self.limits = codec.Limits(max_samples=max_samples(config.max_batch_size))
        self.inflight = 0
        loaded = loading.load(
            Path(served.export_dir),
            served.format,
            config.threads,
            config.trust,
            config.device,
            config.pins,
        )
        self.device = loaded.device
        manifest = loaded.manifest
        self.limits = replace(self.limits, max_axes=bounded.axis_bounds(manifest, served.format))
        self.format = served.format
        self.export_dir = str(served.export_dir)
        self.platform = loaded.platform
        self.torch_free = loaded.torch_free
        self._forward = loaded.forward
        self.specs = manifest.input_specs(served.format)
        self.output_specs = manifest.outputs
        self.output_names = manifest.output_names
        self.per_sample = manifest.per_sample  # a detector's fields: kept whole, unbatched
        histogram = BATCH_SIZE.labels(model_name=served.name)
        passes = FORWARD_PASSES.labels(model_name=served.name, slot=SLOT)

        def counted(size: int) -> None:
            histogram.observe(size)
            passes.inc()

        self.stages = {
            k: h.labels(model_name=served.name, format=served.format) for k, h in STAGES.items()
        }
        queue, compute = self.stages["queue"], self.stages["compute"]

        def timed(waited_s: float, took_s: float) -> None:
            queue.observe(waited_s)
            compute.observe(took_s)

        self.batcher = Batcher(
            forward=self._forward,
            input_axes={s.name: s.batch_axis for s in self.specs},
            output_axes=[o.batch_axis or 0 for o in manifest.outputs],
            max_batch_size=config.max_batch_size,
            max_delay_ms=config.max_batch_delay_ms,
            stack=manifest.serving.stack_requests,
            on_batch=counted,
            on_timing=timed,
        )
        self._forward(codec.warm_up_inputs(loaded.warmup, self.specs))
        WARMED.labels(model_name=served.name).set(1)
        if SHADOW is not None:
            SHADOW.known(self)
        log.info(
            "%s (%s, %s, version %s) loaded and warmed up on %s%s",
            served.name,
            served.format,
            served.export_dir,
            self.version,
            self.device,
            " (torch-free)" if self.torch_free else "",
        )
        self.ready = True

    def get_input_types(self) -> list[dict[str, Any]]:
        return [_describe(s.name, s.dtype, s.shape) for s in self.specs]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [_describe(o.name, o.dtype, o.shape) for o in self.output_specs]

    def decode(self, payload: Any) -> tuple[dict[str, np.ndarray], bool]:
        """An InferRequest → checked arrays with their batch axis, and whether it had none."""
        if not isinstance(payload, kserve.InferRequest):
            raise Refused("Send an Open Inference Protocol (v2) request.")
        return self.check(payload.inputs)

    def check(self, tensors: Any) -> tuple[dict[str, np.ndarray], bool]:
        """Input tensors (kserve's InferInput or oip.Tensor: name, datatype, shape,
        as_numpy) → checked arrays with their batch axis, and whether they had none: read
        by the Open Inference Protocol's one server-side reader (codec.oip_arrays), which
        the TorchServe handler's OIP requests go through too."""
        try:
            return codec.oip_arrays(tensors, self.specs, self.limits)
        except codec.RequestError as err:
            raise Refused(str(err), 413 if err.status == 413 else 400) from None

    async def run(
        self, arrays: dict[str, np.ndarray], unbatched: bool, request_id: str = ""
    ) -> list[np.ndarray]:
        """Checked arrays through the batcher → the outputs, in the request's own shape;
        with --shadow, a sample of them handed to the shadow check."""
        self.inflight += 1
        stamps = [] if tracing.TRACING is not None else None
        try:
            outputs = await self.batcher.submit(arrays, stamps)
        finally:
            self.inflight -= 1
        if stamps:
            self._traced(stamps[0])
        if SHADOW is not None:
            traced = tracing.TRACING
            trace_id = tracing.trace_id(traced.current()) if traced is not None else ""
            SHADOW.offer(self, arrays, outputs, request_id, trace_id)
        return unbatch(outputs, self.output_names, self.per_sample) if unbatched else outputs

    def _traced(self, done: Any) -> None:
        """The request's queue wait and the forward pass it was part of, as spans."""
        tracer = tracing.TRACING
        if tracer is None or not done.size:
            return
        tracer.record("queue", done.queued, done.began)
        tracer.record(
            "forward",
            done.began,
            done.began + done.took,
            {
                "model.name": self.name,
                "model.version": self.version,
                "model.format": self.format,
                "batch.size": done.size,
            },
        )

    def observe(self, stage: str, seconds: float) -> None:
        """A request's time in `stage` ("decode" or "encode"; the batcher times the rest),
        and its span when tracing is on (ending now)."""
        self.stages[stage].observe(seconds)
        if tracing.TRACING is not None:
            now = time.perf_counter()
            tracing.TRACING.record(stage, now - seconds, now)

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        started = time.perf_counter()
        arrays, unbatched = self.decode(payload)
        try:  # the outputs asked, checked before the forward pass: a refusal costs none
            binary.requested(payload.request_outputs, self.output_names)
        except ClientError as err:  # as bad inputs are refused: gRPC's INVALID_ARGUMENT
            raise Refused(err.reason, err.status) from None
        self.observe("decode", time.perf_counter() - started)
        rid = payload.id or str(uuid.uuid4())  # the answer's and the shadow sample's, as REST
        outputs = await self.run(arrays, unbatched, rid)
        started = time.perf_counter()
        response = oip.Response(
            tuple(
                oip.Tensor.from_array(n, o) for n, o in zip(self.output_names, outputs, strict=True)
            ),
            id=rid,
            model_name=self.name,
            model_version=str(self.version),
        )
        answer = binary.infer_response(
            response, payload.use_binary_outputs, payload.request_outputs
        )
        self.observe("encode", time.perf_counter() - started)
        return answer


def _describe(name: str, dtype: str, shape: Any) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": oip.datatype_of(dtype) if dtype else "FP32",
        "shape": [-1 if isinstance(d, str) else int(d) for d in shape],
    }
