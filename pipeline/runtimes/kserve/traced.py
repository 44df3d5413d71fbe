"""The KServe runtime's request spans (pipeline_runtime.tracing), REST and gRPC.

Installed only when tracing is on. Each inference request gets a SERVER span that
continues the client's `traceparent` (a header, or gRPC metadata) and answers with
`traceresponse`; inside it the Guard records `auth`, the model `decode`, `queue`,
`forward` (batch size, model, version and format as attributes) and `encode`. Health,
metadata and /metrics are not traced.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from pipeline.runtimes.kserve.fastpath import INFER
from pipeline.runtimes.kserve.security import ASGIApp, Receive, Scope, Send
from pipeline_runtime import tracing

INFER_RPC = "/inference.GRPCInferenceService/ModelInfer"
ACCESS_LOGGER = "uvicorn.access"  # kserve's access log (kserve.logging)


def install_access_log() -> None:
    """The trace id at the end of each access-log line written inside a traced request."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, tracing.TraceIdFilter) for f in logger.filters):
        logger.addFilter(tracing.TraceIdFilter())


class Traced:
    """ASGI middleware, outermost: the REST infer routes' SERVER spans."""

    def __init__(self, app: ASGIApp, tracer: tracing.Tracing) -> None:
        self.app, self.tracer = app, tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        match = INFER.fullmatch(path) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        attributes = {"http.request.method": "POST", "url.path": path, "model.name": match[1]}
        if match[2]:
            attributes["model.version"] = match[2]
        carrier = tracing.carrier_of(scope.get("headers"))
        route = (
            "/v2/models/{model}/versions/{version}/infer"
            if match[2]
            else "/v2/models/{model}/infer"
        )
        with self.tracer.server_span(f"POST {route}", carrier, attributes) as span:
            header = (tracing.TRACERESPONSE.encode(), tracing.traceresponse(span).encode())

            async def answer(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), header]}
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, answer)


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """ModelInfer's SERVER span; outermost, so the token check inside it is timed as
    `auth`. The answer's initial metadata carries `traceresponse`."""

    def __init__(self, tracer: tracing.Tracing) -> None:
        self.tracer = tracer

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        began_ns, began = time.time_ns(), time.perf_counter()
        handler = await continuation(details)  # the token interceptor runs in here
        checked = time.perf_counter()
        if details.method != INFER_RPC or handler is None or handler.unary_unary is None:
            return handler
        carrier = tracing.carrier_of(details.invocation_metadata)
        inner, tracer = handler.unary_unary, self.tracer

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            attributes = {
                "rpc.system": "grpc",
                "rpc.method": "ModelInfer",
                "model.name": getattr(request, "model_name", ""),
            }
            with tracer.server_span(
                "grpc ModelInfer", carrier, attributes, start_time=began_ns
            ) as span:
                # As REST's auth span: the token interceptor's verdict (its refusal says so).
                result = getattr(inner, "auth_result", "ok")
                tracer.record("auth", began, checked, {"auth.result": result})
                await context.send_initial_metadata(
                    ((tracing.TRACERESPONSE, tracing.traceresponse(span)),)
                )
                return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            traced,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
