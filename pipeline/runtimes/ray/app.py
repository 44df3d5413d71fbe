"""The Ray Serve application: one Open Inference Protocol ingress, one deployment per model.

`build(config)` binds them into one Serve application. The ingress (`Ingress`) answers
the Open Inference Protocol over REST for every served model, with the shared guard's
token, body limit and error shapes (pipeline.serving.guard), and reads each request
with the protocol's one server-side reader (codec.oip_arrays); it hands the checked
arrays to the model's deployment through a deployment handle. Each model deployment
(`Model`) loads its export the way the KServe runtime's workers do
(pipeline.serving.loading: torch-free for ONNX) and runs requests in `serve.batch`
batches, stacked along their batch axis when their other dimensions agree.

Why one ingress application rather than one application per model: Ray Serve routes
REST by route prefix and gRPC by an `application` metadata key that tritonclient and
kserve's client never send; one ingress that routes by model name serves both the same
way (docs/notes/ray-serve-research.md). The ingress is pinned to the head node of a
cluster the runtime starts (HEAD_RESOURCE), so losing a worker node never loses it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from ray.exceptions import RayActorError
from starlette.requests import Request
from starlette.responses import Response

from pipeline.runtimes.ray import answer
from pipeline.runtimes.ray.availability import Availability, Down
from pipeline.runtimes.ray.constants import LOOPBACK_ENV, deployment_name
from pipeline.serving import guard
from pipeline_runtime import bounded, codec, failure, oip, oiprest
from pipeline_runtime.asked import EXTENSIONS, AskedError, plan, unbatch


def _loopback_only() -> None:
    """Ray Serve 2.60 binds every replica's inter-deployment gRPC server to `[::]:0`
    (ray/serve/_private/replica.py, hard-coded): every interface of the machine. In a
    cluster the runtime started on 127.0.0.1 (the host sets LOOPBACK_ENV), the replica
    binds it to 127.0.0.1 instead, the address its node advertises. This module is
    imported in each replica process when Ray unpickles the deployment, before the
    replica binds the port; the name is looked up in that module at call time."""
    if os.environ.get(LOOPBACK_ENV) != "1":
        return
    from ray._common.tls_utils import add_port_to_grpc_server
    from ray.serve._private import replica

    def on_loopback(server: Any, address: str) -> int:
        return add_port_to_grpc_server(server, "127.0.0.1:0" if address == "[::]:0" else address)

    replica.add_port_to_grpc_server = on_loopback


_loopback_only()

_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/(infer|ready))?/?$")
JSON = "application/json"
log = logging.getLogger(__name__)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status_code=status, media_type=JSON, headers=headers)


def _refused(refusal: guard.Refusal) -> Response:
    return Response(
        refusal.json(guard.oip_shape),
        status_code=refusal.status,
        media_type=JSON,
        headers=dict(refusal.headers),
    )


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


def groups(requests: list[dict[str, np.ndarray]], axes: dict[str, int | None]) -> list[list[int]]:
    """Indices of requests that can share one forward pass: the same shape but for the
    batch axis of every input, in arrival order."""
    out: dict[Any, list[int]] = {}
    for i, arrays in enumerate(requests):
        key = tuple(
            (name, tuple(d for ax, d in enumerate(arrays[name].shape) if ax != (axis or 0)))
            for name, axis in axes.items()
        )
        out.setdefault(key, []).append(i)
    return list(out.values())


@serve.deployment
class Model:
    """One served model's replicas: its export loaded once per replica, warmed up."""

    def __init__(self, served: dict[str, Any], threads: int, batch: dict[str, Any]) -> None:
        from pipeline.serving.loading import load

        # On the GPU Ray assigned (its CUDA_VISIBLE_DEVICES), or on CPU without one.
        device = "cuda" if served.get("gpus") else "cpu"
        loaded = load(
            Path(served["export_dir"]),
            served["format"],
            threads,
            served["trust"],
            device,
            served.get("pins"),
        )
        manifest = loaded.manifest
        self.device = loaded.device
        self.forward = loaded.forward
        self.specs = manifest.input_specs(served["format"])
        self.axes = {s.name: s.batch_axis for s in self.specs}
        self.output_axes = [o.batch_axis or 0 for o in manifest.outputs]
        self.stack = manifest.serving.stack_requests
        self.forward(codec.warm_up_inputs(loaded.warmup, self.specs))
        self.batched.set_max_batch_size(max(1, int(batch["max_batch_size"])))
        self.batched.set_batch_wait_timeout_s(float(batch["wait_ms"]) / 1e3)

    async def __call__(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        answer = await self.batched(arrays)
        if isinstance(answer, Exception):  # this request's own failure, not its batch's
            raise answer
        return answer

    def _alone(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray] | Exception:
        try:
            return self.forward(arrays)
        except Exception as err:  # noqa: BLE001 - handed back to its own request only
            return err

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def batched(
        self, requests: list[dict[str, np.ndarray]]
    ) -> list[list[np.ndarray] | Exception]:
        """One answer (or its own failure) per request: serve.batch would hand an exception
        raised here to every request of the batch, failing a bad request's peers."""
        if not self.stack:  # a sample's outputs depend on its batch: one pass each
            return [self._alone(r) for r in requests]
        answers: list[list[np.ndarray] | Exception] = [[] for _ in requests]
        for members in groups(requests, self.axes):
            if len(members) == 1:
                answers[members[0]] = self._alone(requests[members[0]])
                continue
            batch = {
                name: np.concatenate([requests[i][name] for i in members], axis=axis or 0)
                for name, axis in self.axes.items()
            }
            try:
                outputs = self.forward(batch)
            except Exception:  # noqa: BLE001 - a stacked pass failed: each request alone
                for i in members:
                    answers[i] = self._alone(requests[i])
                continue
            first, axis = next(iter(self.axes.items()))
            start = 0
            for i in members:
                n = requests[i][first].shape[axis or 0]
                answers[i] = [
                    np.take(o, range(start, start + n), axis=ax)
                    for o, ax in zip(outputs, self.output_axes, strict=False)
                ]
                start += n
        return answers


def _describe(name: str, dtype: str, shape: Any) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": oip.NAMES[dtype],
        "shape": [d if isinstance(d, int) else -1 for d in shape],
    }


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Ingress:
    """The Open Inference Protocol over REST, for every model the application serves."""

    def __init__(self, config: dict[str, Any], **handles: Any) -> None:
        from pipeline.core.manifest import read_manifest

        self.handles = handles
        # Serve's own word on which models have no replica running (availability.py).
        self.available = Availability(
            {m["name"]: deployment_name(m["name"]) for m in config["models"]}
        )
        self.keys = guard.Keys(Path(config["token_file"]))
        # A deadline on the body: a request slot (max_ongoing_requests) is held per
        # connection while its body is read, and Serve's proxy sets none.
        self.limit = guard.BodyLimit(
            int(config["max_request_size"]),
            float(config.get("body_timeout_s", guard.BODY_TIMEOUT_S)),
        )
        self.models: dict[str, dict[str, Any]] = {}
        for served in config["models"]:
            manifest = read_manifest(Path(served["export_dir"]))
            specs = manifest.input_specs(served["format"])
            self.models[served["name"]] = {
                "specs": specs,
                "outputs": manifest.output_names,
                "per_sample": manifest.per_sample,
                "version": str(served.get("version") or 1),
                "limits": codec.Limits(max_axes=bounded.axis_bounds(manifest, served["format"])),
                "metadata": {
                    "name": served["name"],
                    "versions": [str(served.get("version") or 1)],
                    "platform": served["platform"],
                    "inputs": [_describe(s.name, s.dtype, s.shape) for s in specs],
                    "outputs": [_describe(o.name, o.dtype, o.shape) for o in manifest.outputs],
                },
            }

    async def __call__(self, request: Request) -> Response:
        # Under a route prefix of its own (a shared cluster), the path after it.
        path = request.url.path.removeprefix(request.scope.get("root_path", "")) or "/"
        if path == "/v2/health/live":
            return _json({"live": True})
        if path == "/v2/health/ready":  # every model has a replica running
            down = self.available.down
            if down:
                return _json({"ready": False, "error": _down(down)}, 503)
            return _json({"ready": True})
        refusal = guard.check_token(self.keys, request.headers.get("Authorization"))
        refusal = refusal or self.limit.check_declared(request.headers.get("Content-Length"))
        refusal = refusal or guard.unsupported_encoding(request.headers.get("Content-Encoding"))
        if refusal is not None:
            return _refused(refusal)
        if path.rstrip("/") == "/v2":
            return _json(
                {"name": "pipeline-ray", "version": serve.__name__, "extensions": EXTENSIONS}
            )
        route = _ROUTE.match(path)
        if route is None:
            return _error(404, f"No route {path}; see /v2/models/<name>/infer.")
        name, version, action = route.groups()
        model = self.models.get(name)
        if model is None:
            return _error(404, f"No model {name!r}; this server serves {sorted(self.models)}.")
        if version is not None and version != model["version"]:
            return _error(404, f"Model {name!r} has no version {version!r}.")
        if action is None and request.method == "GET":
            return _json(model["metadata"])
        if action == "ready" and request.method == "GET":
            why = self.available.down.get(name)
            if why is not None:
                return _json({"name": name, "ready": False, "error": _down({name: why})}, 503)
            return _json({"name": name, "ready": True})
        if action != "infer" or request.method != "POST":
            return _error(405, f"{request.method} {path} is not a route; POST .../infer.")
        return await self._infer(request, name, model)

    async def _infer(self, request: Request, name: str, model: dict[str, Any]) -> Response:
        body = await self.limit.read(request.stream())
        if isinstance(body, guard.Refusal):
            return _refused(body)
        body = guard.decode_body(body, request.headers.get("Content-Encoding"), self.limit)
        if isinstance(body, guard.Refusal):
            return _refused(body)
        try:
            parsed = oiprest.parse(body, request.headers.get(oip.HEADER_LENGTH))
            arrays, unbatched = codec.oip_arrays(parsed.inputs, model["specs"], model["limits"])
        except codec.RequestError as err:
            return _error(413 if err.status == 413 else 400, str(err))
        except (oip.OipError, ValueError) as err:  # oiprest.BodyError: the KServe runtime's words
            return _error(400, str(err))
        try:
            plan(parsed, model["outputs"])
        except AskedError as err:
            return _error(400, str(err))
        why = await self.available.wait(name)
        if why is not None:  # Serve keeps retrying the replica; the client may too, later
            return _json({"error": _down({name: why})}, 503, {"Retry-After": "5"})
        started = time.perf_counter()
        try:
            outputs = await self.available.answer(self.handles[name].remote(arrays), name)
        except Down as down:  # its replica died while this request waited for it
            return _json({"error": _down({name: str(down)})}, 503, {"Retry-After": "5"})
        except RayActorError as err:
            # The replica died with this request on it (its node lost): nothing was
            # answered, so the client may resend; Serve routes the resend to a live one.
            return _json(
                {"error": f"The replica serving {name!r} was lost ({type(err).__name__}); retry."},
                503,
                {"Retry-After": "1"},
            )
        except Exception as err:  # the model failed: the server's fault, said in JSON
            # Serve's proxy would answer a text 500; the replica's traceback goes to the log.
            log.exception("inference failed for %s", name)
            return _error(500, f"Inference failed: {failure.summary(err)}")
        if unbatched:
            outputs = unbatch(outputs, model["outputs"], model["per_sample"])
        meta = {"model_name": name, "model_version": model["version"]}
        content, header_length = answer.encode(parsed, meta, model["outputs"], outputs)
        headers = {"x-forward-ms": f"{(time.perf_counter() - started) * 1e3:.3f}"}
        if header_length is not None:
            headers[oip.HEADER_LENGTH] = str(header_length)
            return Response(content, media_type="application/octet-stream", headers=headers)
        return Response(content, media_type=JSON, headers=headers)


def _down(down: dict[str, str]) -> str:
    return "; ".join(f"no replica of {m!r} is running ({why})" for m, why in sorted(down.items()))


def build(config: dict[str, Any], head_resource: str | None) -> Any:
    """The application: the ingress bound to one deployment per served model."""
    handles = {}
    for served in config["models"]:
        options: dict[str, Any] = {
            "name": deployment_name(served["name"]),
            "ray_actor_options": {"num_cpus": config["replica_cpus"]},
            # A dead replica is noticed within seconds, not Serve's default 10 s period.
            "health_check_period_s": 1.0,
            "health_check_timeout_s": 5.0,
            # Serve's default of 5 requests in flight per replica made the router back off
            # and retry past it: 12 req/s at concurrency 32 against 85 at 8 (2-core
            # machine). A replica takes enough to fill its batches, and queues the rest.
            "max_ongoing_requests": max(32, 4 * int(config["max_batch_size"])),
        }
        gpus = float(config.get("replica_gpus") or 0)
        if gpus:
            options["ray_actor_options"]["num_gpus"] = gpus
        if config["autoscaling"]:
            options["autoscaling_config"] = config["autoscaling"]
        else:
            options["num_replicas"] = config["replicas"]
        if config.get("max_replicas_per_node"):
            options["max_replicas_per_node"] = config["max_replicas_per_node"]
        batch = {"max_batch_size": config["max_batch_size"], "wait_ms": config["batch_wait_ms"]}
        handles[served["name"]] = Model.options(**options).bind(
            served
            | {"trust": config.get("trust", []), "pins": config.get("pins", {}), "gpus": gpus},
            config["threads"],
            batch,
        )
    ingress_options: dict[str, Any] = {"num_cpus": 0}
    if head_resource:
        ingress_options["resources"] = {head_resource: 0.01}
    # The ingress only parses and forwards (async): it holds every client's request.
    return Ingress.options(ray_actor_options=ingress_options, max_ongoing_requests=1024).bind(
        config, **handles
    )


def app_builder(args: dict[str, Any]) -> Any:
    """Serve's application builder, named by a Serve config's `import_path` (`pipeline
    deploy ray`'s RayService): `args` are the settings `pipeline serve --runtime ray`
    writes to ray.json. On a cluster the runtime did not start, so no head resource."""
    return build(args, None)
