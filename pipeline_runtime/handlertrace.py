"""The TorchServe handler's spans: preprocess, inference and postprocess joined to the
gateway's trace (pipeline_runtime.tracing).

The gateway sends each prediction's `traceparent` to TorchServe, which hands request
headers to the handler (`context.get_request_header`). With tracing on in the worker
(the same OTEL_* variables, inherited from `pipeline serve`), each request of a batch
gets a `handle` span under the gateway's `forward to TorchServe`, holding the batch's
three steps (shared by every request in the batch; `batch.size` says how many).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipeline_runtime import tracing

SERVICE = "pipeline-torchserve-handler"
STEPS = ("preprocess", "inference", "postprocess")


def install(handler: Any) -> bool:
    """Time the handler's steps from now on, when tracing is on; whether it is."""
    if tracing.setup(SERVICE) is None:
        return False
    handler.trace_steps = []
    for step in STEPS:
        setattr(handler, step, _stamped(getattr(handler, step), step, handler.trace_steps))
    return True


def _stamped(step: Callable[..., Any], name: str, into: list[Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            into.append((name, began, time.perf_counter()))

    return run


def emit(handler: Any, count: int, context: Any, model: str) -> None:
    """The spans of the batch just handled, one `handle` span per traced request."""
    steps = list(getattr(handler, "trace_steps", ()))
    if not steps:
        return
    handler.trace_steps.clear()
    tracer = tracing.TRACING
    if tracer is None:
        return
    began, ended = steps[0][1], steps[-1][2]
    for idx in range(count):
        carrier = {}
        for key in (tracing.TRACEPARENT, tracing.TRACESTATE):
            value = context.get_request_header(idx, key)
            if value:
                carrier[key] = value.decode() if isinstance(value, bytes) else str(value)
        if tracing.TRACEPARENT not in carrier:
            continue  # not traced by the gateway (TorchServe's own port)
        attributes = {"model.name": model, "batch.size": count}
        root = tracer.record(
            "handle", began, ended, attributes, carrier=carrier, kind=tracer.server_kind
        )
        for name, b, e in steps:
            tracer.record(name, b, e, parent=root)
