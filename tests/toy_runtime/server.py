"""The toy runtime's server: Open Inference Protocol JSON over aiohttp, one process.

`python -m tests.toy_runtime.server <run_dir>/toy.json`. Health, model metadata and
inference; every route but health needs the inference token. Small on purpose: it
shows what a runtime must answer, not how to answer it fast. The token and the body
limit are the shared guard's (pipeline.serving.guard) and the bodies are read and
written by the shared OIP messages (pipeline_runtime.oip), as a real runtime's are,
so the toy proves those shared parts, not only the runtime hooks.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from pipeline.core.manifest import artifact_path, read_manifest
from pipeline.formats import base as registry
from pipeline.serving import guard, live
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


class Versions:
    """One served model's loaded versions and where unversioned requests go, kept as the
    run folder's live state says (pipeline.serving.live: the same file, acknowledgement
    and tallies the KServe runtime's workers use)."""

    def __init__(self, state: live.ModelVersions) -> None:
        self.state = state
        self.loaded = {n: _load(vars(v)) for n, v in state.versions.items()}
        self.splitter = live.Splitter()

    def pick(self, version: str | None) -> tuple[int, dict[str, Any]]:
        if version:
            if not version.isdigit() or int(version) not in self.loaded:
                raise web.HTTPNotFound(
                    text=json.dumps({"error": f"no version {version!r}"}),
                    content_type="application/json",
                )
            return int(version), self.loaded[int(version)]
        canary = self.state.canary
        if canary in self.loaded and self.splitter.to_canary(self.state.percent):
            return canary, self.loaded[canary]
        return self.state.default, self.loaded[self.state.default]


def _initial(config: dict[str, Any], run_dir: Path) -> dict[str, Versions]:
    state = live.read(run_dir)
    out = {}
    for m in config["models"]:
        wanted = state.models.get(m["name"]) if state else None
        if wanted is None:
            number = m.get("version") or 1
            wanted = live.ModelVersions(
                {number: live.Loaded(number, m["export_dir"], m["format"])}, number
            )
        out[m["name"]] = Versions(wanted)
    return out


async def _watch(run_dir: Path, models: dict[str, Versions]) -> None:
    """Apply each new live state (load new versions off the loop, then move the split,
    then drop the rest); pipeline.serving.live acknowledges it and writes the tallies."""
    loop = asyncio.get_running_loop()

    async def apply(state: live.LiveState) -> None:
        for name, wanted in state.models.items():
            model = models[name]
            for number, where in wanted.versions.items():
                if number not in model.loaded:
                    TALLIES.pop((name, number), None)
                    model.loaded[number] = await loop.run_in_executor(None, _load, vars(where))
            model.state = wanted
            for number in set(model.loaded) - set(wanted.versions):
                del model.loaded[number]  # requests already on it hold their own reference

    await live.follow(run_dir, 0, TALLIES, apply)


TALLIES: dict[tuple[str, int], live.Tally] = {}


def build_app(config: dict[str, Any], run_dir: Path) -> web.Application:
    keys = guard.Keys(Path(config["token_file"]))
    limit = guard.BodyLimit(int(config["max_request_size"]))
    models = _initial(config, run_dir)

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

    def model_of(request: web.Request) -> tuple[int, dict[str, Any]]:
        name = request.match_info["name"]
        if name not in models:
            raise web.HTTPNotFound(text=json.dumps({"error": f"no model {name}"}))
        return models[name].pick(request.match_info.get("version"))

    async def metadata(request: web.Request) -> web.Response:
        manifest = model_of(request)[1]["manifest"]
        tensor = lambda t: {"name": t.name, "datatype": V2_NAMES[t.dtype], "shape": [-1]}  # noqa: E731
        return web.json_response(
            {
                "name": request.match_info["name"],
                "versions": [str(v) for v in sorted(models[request.match_info["name"]].loaded)],
                "platform": "toy",
                "inputs": [tensor(i) for i in manifest.inputs],
                "outputs": [tensor(o) for o in manifest.outputs],
            }
        )

    async def infer(request: web.Request) -> web.Response:
        started = time.perf_counter()
        version, model = model_of(request)
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
            model_version=str(version),
        )
        content, _ = answer.to_rest(binary=False)
        if "version" not in request.match_info:  # the split's traffic: a canary's record
            key = (request.match_info["name"], version)
            TALLIES.setdefault(key, live.Tally()).add((time.perf_counter() - started) * 1e3, True)
        return web.Response(body=content, content_type="application/json")

    async def watching(app: web.Application) -> Any:
        task = asyncio.get_running_loop().create_task(_watch(run_dir, models))
        yield
        task.cancel()

    app = web.Application(middlewares=[check], client_max_size=limit.limit + 1)
    app.cleanup_ctx.append(watching)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/health/live", ready)
    for where in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.router.add_get(where, metadata)
        app.router.add_post(f"{where}/infer", infer)
    return app


def main(argv: list[str]) -> int:
    conf = Path(argv[0])
    config = json.loads(conf.read_text())
    if config.get("threads"):  # --threads-per-worker: intra-op threads of its one process
        torch.set_num_threads(config["threads"])
    app = build_app(config, conf.parent)
    web.run_app(app, host=config["host"], port=config["port"], print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
