"""The KServe runtime's REST infer route, answered without FastAPI or pydantic.

kserve 0.21 answers `POST /v2/models/{name}/infer` through FastAPI: the body is
parsed into a pydantic `InferenceRequest` (every tensor element a validated
Python object), turned into kserve's `InferRequest`, and the answer goes back
through a pydantic `InferenceResponse` and the JSON encoder. For the digits CNN
that Python path was about 95% of a served request (issue 28). `FastInfer`, a
raw ASGI middleware inside the `Guard` (token, body size and routes are still
checked first), answers the route for the served models itself:

* the body is JSON unless `Inference-Header-Content-Length` is present, whatever
  the Content-Type says (the binary tensor extension's rule; Triton's client
  sends JSON with no Content-Type at all);
* JSON is parsed by orjson, each tensor's `data` list becomes one numpy array
  (`np.asarray`, in C), binary tensors are read in place (`np.frombuffer`);
* answers are written by orjson straight from the numpy arrays
  (`OPT_SERIALIZE_NUMPY`), or as the binary extension when asked for.

Everything else (health, metadata, unknown models, /metrics) stays kserve's.
The model's checks and its batcher are the ones gRPC requests go through.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import orjson
from kserve.metrics import PREDICT_HIST_TIME
from prometheus_client import Histogram

from pipeline.runtimes.kserve.security import ASGIApp, Receive, Scope, Send
from pipeline_runtime import failure, oip, oiprest
from pipeline_runtime.asked import AskedError, plan

log = logging.getLogger("pipeline.runtimes.kserve")

_NAME = r"([A-Za-z0-9_.\-]+)"
INFER = re.compile(rf"/v2/models/{_NAME}(?:/versions/{_NAME})?/infer")
# kserve 0.21 answers its version routes with NotImplementedError (a 500): these are ours.
VERSION = re.compile(rf"/v2/models/{_NAME}/versions/{_NAME}(/ready)?")
LENGTH_HEADER = oip.HEADER_LENGTH.lower().encode()
REQUEST_SECONDS = Histogram(
    "pipeline_kserve_request_duration_seconds",
    "REST inference requests, from the whole body read to the answer written",
    ["model_name"],
)


class Model(Protocol):
    """What FastInfer needs of one served version (models.ExportModel)."""

    name: str
    version: int
    output_names: list[str]

    def check(self, tensors: Any) -> tuple[dict[str, np.ndarray], bool]: ...

    async def run(
        self, arrays: dict[str, np.ndarray], unbatched: bool, request_id: str = ""
    ) -> list[np.ndarray]: ...

    def observe(self, stage: str, seconds: float) -> None: ...


class Versions(Protocol):
    """What FastInfer needs of a served model's versions (versioned.VersionedModel)."""

    def pick(self, version: str | None) -> Model: ...

    def metadata(self, version: str) -> dict[str, Any]: ...

    def record(self, version: int, started: float, ok: bool) -> None: ...


class ClientError(Exception):
    """A request's fault: its status (4xx) and the message for `{"error": ...}`."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason, self.status = reason, status


def parse(body: bytes, headers: Mapping[bytes, bytes]) -> oip.Request:
    """A REST infer body → typed request (pipeline_runtime.oiprest, the Ray ingress's too)."""
    try:
        return oiprest.parse(body, headers.get(LENGTH_HEADER))
    except oiprest.BodyError as err:
        raise ClientError(str(err)) from None


def encode(
    request: oip.Request,
    model: Model,
    outputs: list[np.ndarray],
    plan: list[tuple[str, bool]] | None = None,
    rid: str | None = None,
) -> tuple[bytes, int | None]:
    """The answer as JSON, or as the binary extension for the outputs asked in binary;
    `plan`: what `_plan` said of the request, when already asked; `rid`: the answer's id
    (default: the request's, else a new one)."""
    arrays = dict(zip(model.output_names, outputs, strict=True))
    if plan is None:
        plan = _plan(request, model)
    items, tails = [], []
    for name, binary in plan:
        # np.require, not ascontiguousarray: that makes a 0-d answer (an image's detection
        # count, sent without its batch axis) 1-d, and clients then refuse its shape.
        array = np.require(arrays[name], requirements="C")
        item: dict[str, Any] = {
            "name": name,
            "datatype": oip.datatype_of(array.dtype),
            "shape": list(array.shape),
        }
        if binary:
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            item["parameters"] = {"binary_data_size": len(raw)}
            tails.append(raw)
        else:
            item["data"] = array.reshape(-1)
        items.append(item)
    header = {
        "model_name": model.name,
        "model_version": str(model.version),
        "id": rid or request.id or str(uuid.uuid4()),
        "outputs": items,
    }
    try:
        text = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # a dtype orjson does not write: the slow way, still correct
        for item in items:
            if "data" in item:
                item["data"] = item["data"].tolist()
        text = orjson.dumps(header)
    return (text + b"".join(tails), len(text)) if tails else (text, None)


def _plan(request: oip.Request, model: Model) -> list[tuple[str, bool]]:
    """What the request asks of its answer (pipeline_runtime.asked), or its ClientError."""
    try:
        return plan(request, model.output_names)
    except AskedError as err:
        raise ClientError(str(err)) from None


class FastInfer:
    """ASGI middleware: the infer routes of the served models, versioned or not, and the
    versions' metadata and readiness (see the module doc)."""

    def __init__(self, app: ASGIApp, models: Mapping[str, Versions]) -> None:
        self.app = app
        self.models = dict(models)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope.get("path", ""), scope.get("method")
        match = INFER.fullmatch(path) if scope["type"] == "http" else None
        versions = self.models.get(match[1]) if match and method == "POST" else None
        if versions is None:
            http = scope["type"] == "http"
            about = VERSION.fullmatch(path) if http and method in ("GET", "HEAD") else None
            versioned = match if match and match[2] is not None and method == "POST" else about
            # A version's route of a model not served: kserve answers 501 ("not supported").
            if versioned and versioned[1] not in self.models:
                await _answer(send, 404, b"application/json", _error(unknown_model(versioned[1])))
                return
            if about:
                await self._version(send, self.models[about[1]], about[2], bool(about[3]))
                return
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        if body is None:
            return  # the client went away
        started = time.perf_counter()
        headers = dict(scope.get("headers", []))
        extra: list[tuple[bytes, bytes]] = []
        model = None
        try:
            model = versions.pick(match[2])
            request = parse(body, headers)
            arrays, unbatched = model.check(request.inputs)
            plan = _plan(request, model)  # before the forward pass: a refusal costs none
            model.observe("decode", time.perf_counter() - started)
            # One id for the answer and the shadow check's sample: a client that sent none
            # gets a generated one, which its sample and log line carry too.
            rid = request.id or str(uuid.uuid4())
            outputs = await model.run(arrays, unbatched, rid)
            encoding = time.perf_counter()
            answer, json_length = encode(request, model, outputs, plan, rid)
            model.observe("encode", time.perf_counter() - encoding)
            status, content_type = 200, b"application/json"
            if json_length is not None:
                content_type = b"application/octet-stream"
                extra.append((LENGTH_HEADER, str(json_length).encode()))
        except ClientError as err:
            status, content_type, answer = err.status, b"application/json", _error(err.reason)
        except Exception as err:  # the model failed: the server's fault, said in JSON
            log.exception("inference failed for %s", match[1])
            status, content_type = 500, b"application/json"
            answer = _error(f"Inference failed: {failure.summary(err)}")
        await _answer(send, status, content_type, answer, extra)
        if model is not None:
            if match[2] is None:  # the split's traffic: what a canary is judged on
                versions.record(model.version, started, status < 500)
            took = time.perf_counter() - started
            REQUEST_SECONDS.labels(model_name=model.name).observe(took)
            # kserve's own predict histogram, which its gRPC path (Model.__call__) feeds: a
            # dashboard built on it would otherwise see no REST request at all.
            PREDICT_HIST_TIME.labels(model_name=model.name).observe(took)

    async def _version(self, send: Send, versions: Versions, version: str, ready: bool) -> None:
        """GET /v2/models/<name>/versions/<v>[/ready]: its metadata, or whether it serves."""
        try:
            meta = versions.metadata(version)
        except ClientError as err:
            await _answer(send, err.status, b"application/json", _error(err.reason))
            return
        body = {"name": meta["name"], "ready": True} if ready else meta
        await _answer(send, 200, b"application/json", orjson.dumps(body))


async def _answer(
    send: Send,
    status: int,
    content_type: bytes,
    answer: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    raw = [(b"content-type", content_type), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw + (extra or [])})
    await send({"type": "http.response.body", "body": answer})


def unknown_model(name: str) -> str:
    """The 404 of a model this server does not serve, in kserve's words."""
    return f"Model with name {name} does not exist."


def _error(reason: str) -> bytes:
    return orjson.dumps({"error": reason})


async def _body(receive: Receive) -> bytes | None:
    """The whole request body (the Guard has bounded its size); None if the client left."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
