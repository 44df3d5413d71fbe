"""The toy runtime's server: Open Inference Protocol JSON over aiohttp, one process.

`python -m tests.toy_runtime.server <run_dir>/toy.json`. Health, model metadata and
inference; every route but health needs the inference token. Small on purpose: it
shows what a runtime must answer, not how to answer it fast.
"""

from __future__ import annotations

import hmac
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from aiohttp import web

from pipeline.core.manifest import artifact_path, read_manifest
from pipeline.formats import base as registry
from pipeline_runtime.codec import V2_DATATYPES, V2_NAMES


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


def build_app(config: dict[str, Any]) -> web.Application:
    token = json.loads(Path(config["token_file"]).read_text())["inference"]["key"]
    models = {m["name"]: _load(m) for m in config["models"]}

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/v2/health/"):
            given = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), token.encode()):
                return _error(401, "a valid inference token is required")
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
        try:
            body = json.loads(await request.read())
            inputs = {
                i["name"]: torch.from_numpy(
                    np.asarray(i["data"], dtype=V2_DATATYPES[i["datatype"]]).reshape(i["shape"])
                )
                for i in body["inputs"]
            }
        except (ValueError, KeyError, TypeError) as err:
            return _error(400, f"not an Open Inference Protocol JSON request: {err}")
        outputs = model["runner"](inputs)
        return web.json_response(
            {
                "model_name": request.match_info["name"],
                "outputs": [
                    {
                        "name": name,
                        "datatype": V2_NAMES[str(t.dtype).removeprefix("torch.")],
                        "shape": list(t.shape),
                        "data": t.reshape(-1).tolist(),
                    }
                    for name, t in outputs.items()
                ],
            }
        )

    app = web.Application(middlewares=[guard])
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/health/live", ready)
    app.router.add_get("/v2/models/{name}", metadata)
    app.router.add_post("/v2/models/{name}/infer", infer)
    return app


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    web.run_app(build_app(config), host="127.0.0.1", port=config["port"], print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
