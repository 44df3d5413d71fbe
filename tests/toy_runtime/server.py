"""The toy runtime's server: Open Inference Protocol JSON over aiohttp, one process.

`python -m tests.toy_runtime.server <run_dir>/toy.json`. Health, model metadata and
inference; every route but health needs the inference token. Small on purpose: it
shows what a runtime must answer, not how to answer it fast. The token and the body
limit are the shared guard's (pipeline.serving.guard) and the bodies are read and
written by the shared OIP messages (pipeline_runtime.oip), as a real runtime's are,
so the toy proves those shared parts, not only the runtime hooks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from pipeline.core.manifest import artifact_path, read_manifest
from pipeline.formats import base as registry
from pipeline.serving import guard
from pipeline_runtime import oip
from pipeline_runtime.codec import V2_NAMES


def _load(model: dict[str, Any]) -> dict[str, Any]:
    export_dir = Path(model["export_dir"])
    manifest = read_manifest(export_dir)
    fmt = model["format"]
    runner = registry.get(fmt).load(
        artifact_path(export_dir, manifest, fmt),
        inputs=[i.name for i in manifest.inputs],
        outputs=[o.name for o in manifest.outputs],
        record=manifest.artifacts[fmt],
    )
    return {"manifest": manifest, "runner": runner}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _refused(refusal: guard.Refusal) -> web.Response:
    return web.Response(
        status=refusal.status,
        body=refusal.json(guard.oip_shape),
        content_type="application/json",
        headers=dict(refusal.headers),
    )


def build_app(config: dict[str, Any]) -> web.Application:
    keys = guard.Keys(Path(config["token_file"]))
    limit = guard.BodyLimit(int(config["max_request_size"]))
    models = {m["name"]: _load(m) for m in config["models"]}

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/v2/health/"):
            refusal = guard.check_token(keys, request.headers.get("Authorization"))
            refusal = refusal or limit.check_declared(request.headers.get("Content-Length"))
            if refusal is not None:
                return _refused(refusal)
        return await handler(request)

    async def ready(request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    def model_of(request: web.Request) -> dict[str, Any]:
        name = request.match_info["name"]
        if name not in models:
            raise web.HTTPNotFound(text=json.dumps({"error": f"no model {name}"}))
        return models[name]

    async def metadata(request: web.Request) -> web.Response:
        manifest = model_of(request)["manifest"]
        tensor = lambda t: {"name": t.name, "datatype": V2_NAMES[t.dtype], "shape": [-1]}  # noqa: E731
        return web.json_response(
            {
                "name": request.match_info["name"],
                "platform": "toy",
                "inputs": [tensor(i) for i in manifest.inputs],
                "outputs": [tensor(o) for o in manifest.outputs],
            }
        )

    async def infer(request: web.Request) -> web.Response:
        model = model_of(request)
        body = await limit.read(request.content.iter_any())
        if isinstance(body, guard.Refusal):
            return _refused(body)
        length = request.headers.get(oip.HEADER_LENGTH)
        try:
            parsed = oip.Request.from_rest(body, int(length) if length is not None else None)
        except (oip.OipError, ValueError) as err:
            return _error(400, f"not an Open Inference Protocol request: {err}")
        inputs = {n: torch.from_numpy(a.copy()) for n, a in parsed.arrays().items()}
        outputs = model["runner"](inputs)
        answer = oip.Response(
            tuple(oip.Tensor.from_array(n, t.numpy()) for n, t in outputs.items()),
            id=parsed.id,
            model_name=request.match_info["name"],
        )
        content, _ = answer.to_rest(binary=False)
        return web.Response(body=content, content_type="application/json")

    app = web.Application(middlewares=[check], client_max_size=limit.limit + 1)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/health/live", ready)
    app.router.add_get("/v2/models/{name}", metadata)
    app.router.add_post("/v2/models/{name}/infer", infer)
    return app


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    if config.get("threads"):  # --threads-per-worker: intra-op threads of its one process
        torch.set_num_threads(config["threads"])
    web.run_app(build_app(config), host=config["host"], port=config["port"], print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
