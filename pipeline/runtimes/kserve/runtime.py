"""The KServe runtime process: `python -m pipeline.runtimes.kserve.runtime <run_dir>/kserve.json`.

With `--worker SLOT` it is one of the supervisor's workers (supervisor.py): it binds
the HTTP port with SO_REUSEPORT beside the others and answers /v2/health/ready with 200
only once every worker has warmed up. Without it, one process alone (the deploy image).

A real kserve 0.21 `ModelServer` serving one model per export over the Open
Inference Protocol (REST `/v2/...` and gRPC), each model loaded with
`loading.load` (torch-free for ONNX, else the Runner verify uses) and warmed up
on the export's golden inputs before the server opens its ports, so
`/v2/health/ready` is 200 only once every model has run.

What kserve lacks and this adds (docs/notes/kserve-runtime-research.md):
loopback binding (uvicorn and gRPC both bind every address as shipped), the
inference token on REST and gRPC, the body-size limit, only the OIP routes,
`{"error": ...}` 4xx answers for every malformed request (kserve gives 422 or
500 for some), binary-extension bodies read without a per-element list
(`pipeline.runtimes.kserve.binary`), and dynamic batching (`pipeline.runtimes.kserve.batching`) with its
batch sizes on /metrics (`pipeline_kserve_batch_size`).

`import kserve` parses sys.argv at import time, so this module hides the
process's arguments from it; import it only in the runtime process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

_ARGV, sys.argv = sys.argv, sys.argv[:1]  # kserve's import-time argparse must see nothing
try:
    import grpc
    import kserve
    import kserve.model_server as ksms
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from kserve.errors import ModelNotFound
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
    from kserve.protocol.grpc.interceptors import LoggingInterceptor
finally:
    sys.argv = _ARGV

from fastapi import Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402
from prometheus_client import REGISTRY, CollectorRegistry, Gauge  # noqa: E402
from prometheus_client.exposition import choose_encoder  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402

from pipeline.core.errors import PipelineError  # noqa: E402
from pipeline.runtimes.kserve import models as models_module  # noqa: E402
from pipeline.runtimes.kserve.config import RuntimeConfig  # noqa: E402
from pipeline.runtimes.kserve.fastpath import FastInfer  # noqa: E402
from pipeline.runtimes.kserve.liveops import initial  # noqa: E402
from pipeline.runtimes.kserve.models import ExportModel, Refused  # noqa: E402
from pipeline.runtimes.kserve.security import Guard, TokenInterceptor  # noqa: E402
from pipeline.runtimes.kserve.supervisor import (  # noqa: E402
    MULTIPROC_ENV,
    all_ready_marker,
    ready_marker,
)
from pipeline.runtimes.kserve.traced import (  # noqa: E402
    Traced,
    TracingInterceptor,
    install_access_log,
)
from pipeline.runtimes.kserve.versioned import (  # noqa: E402
    ClientErrorsInterceptor,
    VersionedModel,
    VersionedServicer,
    Watcher,
)
from pipeline.serving import live  # noqa: E402
from pipeline.serving.guard import Keys  # noqa: E402
from pipeline_runtime import tracing  # noqa: E402
from pipeline_runtime.asked import EXTENSIONS  # noqa: E402
from pipeline_runtime.files import IntegrityError  # noqa: E402

log = logging.getLogger("pipeline.runtimes.kserve")

# The supervisor's workers share their metrics (prometheus_client's multiprocess mode, set
# in the environment before this process imported it): a scrape is the sum over all.
MULTIPROCESS = bool(os.environ.get(MULTIPROC_ENV))
# One line per live runtime process: its slot and pid (multiprocess mode adds the pid).
WORKER = (
    Gauge(
        "pipeline_kserve_worker",
        "1 per live runtime process",
        ["slot"],
        multiprocess_mode="liveall",
    )
    if MULTIPROCESS
    else Gauge("pipeline_kserve_worker", "1 per runtime process: its slot and pid", ["slot", "pid"])
)
GRACE_S = 5  # seconds the servers get to finish requests on SIGTERM


async def _bad_request(request: Any, exc: Exception) -> JSONResponse:
    if isinstance(exc, RequestValidationError):
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"Malformed request: {first.get('msg', 'invalid body')}" + (
            f" at {where}" if where else ""
        )
    else:
        message = f"Malformed request: {type(exc).__name__}: {exc}"
    return JSONResponse({"error": message}, status_code=400)


async def _refused(request: Any, exc: Refused) -> JSONResponse:
    return JSONResponse({"error": exc.reason}, status_code=exc.status)


async def _not_found(request: Any, exc: ModelNotFound) -> JSONResponse:
    # kserve's handler logs a client's unknown model as ERROR with its traceback; the
    # access log's line (404) says enough.
    return JSONResponse({"error": str(exc)}, status_code=404)


def _reuseport_socket(host: str, port: int) -> socket.socket:
    """A listening socket that the other workers bind too: the kernel spreads new
    connections over them, and a dead worker's share goes to the rest."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP said, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    # (base_events._set_nodelay), and accepted sockets copy it. With 0, Nagle and delayed
    # ACKs made each kept-alive request wait ~40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)  # uvicorn's default backlog
    return sock


def _install(
    config: RuntimeConfig,
    models: list[VersionedModel],
    worker: Worker | None,
    watcher: Watcher,
) -> None:
    """Replace kserve's REST and gRPC servers with ones that bind `config.host`, check
    the token and the body size, and answer malformed requests with 400 JSON. `worker`:
    this process is one of the supervisor's; it shares the ports and is ready only when
    every worker is."""
    keys = Keys(Path(config.token_file)) if config.token_file else None
    host = config.host

    class Rest(ksms.RESTServer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.config.host = host  # kserve hard-codes 0.0.0.0

        def _register_endpoints(self, app: Any) -> None:
            async def ready() -> JSONResponse:
                warm = all(m.ready for m in models) and (worker is None or worker.all_ready())
                # 400 until ready, as Triton answers: the protocol asks for a 4xx.
                return JSONResponse({"ready": warm}, status_code=200 if warm else 400)

            async def metrics(request: Request) -> Response:
                # The sum over every worker's files, whichever worker this scrape reached,
                # in the format the scraper asks for (OpenMetrics or text), as kserve's.
                registry = CollectorRegistry()
                registry.register(_Summed())
                encoder, content_type = choose_encoder(request.headers.get("accept"))
                return Response(encoder(registry), headers={"content-type": content_type})

            # Registered first, so they answer instead of kserve's (always ready; this
            # process's registry alone).
            app.add_api_route("/v2/health/ready", ready, methods=["GET"])
            if MULTIPROCESS:
                app.add_api_route("/metrics", metrics, methods=["GET"])
            super()._register_endpoints(app)

        def create_application(self) -> None:
            super().create_application()
            app = ksms.app
            for exc in (RequestValidationError, ValueError, KeyError, TypeError):
                app.add_exception_handler(exc, _bad_request)
            app.add_exception_handler(Refused, _refused)
            app.add_exception_handler(ModelNotFound, _not_found)
            # Added first, so it runs inside the Guard: the token and size checks stay first.
            app.add_middleware(FastInfer, models={m.name: m for m in models})
            app.add_middleware(Guard, keys=keys, max_body=config.max_request_size, host=config.host)
            if tracing.TRACING is not None:  # outermost: the Guard's check is a span inside
                app.add_middleware(Traced, tracer=tracing.TRACING)

        async def start(self) -> None:
            # Versions follow the run folder's live state from now on (versioned.py).
            self.watching = asyncio.get_running_loop().create_task(watcher.run())
            if worker is None:
                await super().start()
                return
            # kserve's start lets uvicorn bind; a worker hands it a SO_REUSEPORT socket instead.
            self.create_application()
            sock = _reuseport_socket(host, config.http_port)
            worker.mark_ready(f"{host}:{config.http_port}")
            await self._server.serve(sockets=[sock])

    class Grpc(ksms.GRPCServer):
        async def start(self, max_workers: int) -> None:
            interceptors = [LoggingInterceptor(), ClientErrorsInterceptor()]
            if keys is not None:
                interceptors.insert(0, TokenInterceptor(keys))
            if tracing.TRACING is not None:
                interceptors.insert(0, TracingInterceptor(tracing.TRACING))
            self._server = grpc.aio.server(
                futures.ThreadPoolExecutor(max_workers=max_workers),
                interceptors=interceptors,
                options=[
                    ("grpc.max_send_message_length", 64 * 2**20),
                    ("grpc.max_receive_message_length", config.max_request_size),
                    # gRPC's default, said here because the workers rely on it.
                    ("grpc.so_reuseport", 1),
                ],
            )
            grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
                VersionedServicer(
                    {m.name: m for m in models},
                    self._data_plane,
                    self._model_repository_extension,
                ),
                self._server,
            )
            addr = f"[{host}]:{config.grpc_port}" if ":" in host else f"{host}:{config.grpc_port}"
            if config.tls_cert and config.tls_key:
                creds = grpc.ssl_server_credentials(
                    [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())]
                )
                self._server.add_secure_port(addr, creds)
            else:
                self._server.add_insecure_port(addr)
            log.info("gRPC listening on %s", addr)
            await self._server.start()
            await self._server.wait_for_termination()

    ksms.RESTServer = Rest
    ksms.GRPCServer = Grpc
    _install_metadata({m.name: m for m in models})


class _Summed:
    """Every worker's metrics, summed (prometheus_client's multiprocess files), and the
    families no worker has observed yet with no samples, as one process's registry lists
    them: a scrape names every metric from the start (kserve's latency histograms too)."""

    def collect(self) -> Iterator[Any]:
        summed = list(MultiProcessCollector(None).collect())
        seen = {f.name for f in summed}
        yield from summed
        yield from (f for f in REGISTRY.collect() if not f.samples and f.name not in seen)


def _install_metadata(models: dict[str, VersionedModel]) -> None:
    """Model metadata names the model's platform, as the protocol asks (kserve sends ""),
    and the versions it serves (kserve sends none); server metadata lists no extension."""
    original = DataPlane.model_metadata

    async def model_metadata(self: DataPlane, model_name: str) -> dict[str, Any]:
        meta = await original(self, model_name)
        model = models.get(model_name)
        if model is None:
            return meta
        return {**meta, "platform": model.default.platform, "versions": model.versions()}

    DataPlane.model_metadata = model_metadata  # type: ignore[method-assign]
    plain = DataPlane.metadata

    def metadata(self: DataPlane) -> dict[str, Any]:
        # kserve lists the model repository extension always; its routes are closed here
        # (versions change through the run folder). The binary one is the fast path's.
        return {**plain(self), "extensions": list(EXTENSIONS)}

    DataPlane.metadata = metadata  # type: ignore[method-assign]


class Worker:
    """This process as the supervisor's worker `slot` (pipeline.runtimes.kserve.supervisor)."""

    def __init__(self, conf: Path, slot: int) -> None:
        self.slot = slot
        self.mine = ready_marker(conf, slot)
        self.every = all_ready_marker(conf)

    def mark_ready(self, address: str) -> None:
        self.mine.write_text(str(os.getpid()))
        # uvicorn logs no "Uvicorn running on" for sockets handed to it: say it here.
        log.info(
            "worker %d (pid %d): HTTP listening on %s (SO_REUSEPORT)",
            self.slot,
            os.getpid(),
            address,
        )

    def all_ready(self) -> bool:
        return self.every.exists()


def serve(config: RuntimeConfig, run_dir: Path, worker: Worker | None = None) -> None:
    """Serve `config.models` until SIGTERM; `worker`: as one of the supervisor's workers.
    `run_dir`: where the live state is (a restarted worker starts with its versions)."""
    models_module.SLOT = str(worker.slot) if worker else "0"
    if tracing.setup("pipeline-kserve") is not None:
        install_access_log()
    starting = initial(config.models, live.read(run_dir))
    if config.shadow_rate > 0:
        from pipeline.runtimes.kserve.shadow import Shadow

        dirs = tuple(dict.fromkeys(str(e.export_dir) for _, es in starting.values() for e in es))
        models_module.SHADOW = Shadow(config.shadow_rate, run_dir, config.shadow_max_rate, dirs)
    models = []
    for name, (wanted, exports) in starting.items():
        loaded = {e.version: ExportModel(e, config) for e in exports}
        models.append(VersionedModel(name, wanted, loaded))
    if worker is not None:
        mine = {"slot": str(worker.slot)} | ({} if MULTIPROCESS else {"pid": str(os.getpid())})
        WORKER.labels(**mine).set(1)
    watcher = Watcher(
        run_dir,
        worker.slot if worker else 0,
        {m.name: m for m in models},
        lambda served: ExportModel(served, config),
    )
    _install(config, models, worker, watcher)
    server = kserve.ModelServer(
        http_port=config.http_port,
        grpc_port=config.grpc_port,
        # kserve's own workers are processes it spawns from an import string, with none of
        # _install's servers or middlewares: ours are the supervisor's (docs/kserve.md).
        workers=1,
        enable_grpc=True,
        enable_docs_url=False,
        grace_period=GRACE_S,
        enable_latency_logging=False,
        ssl_certfile=config.tls_cert,
        ssl_keyfile=config.tls_key,
    )
    server.http_port = config.http_port  # kserve moves 8080 to 8443 with TLS; keep ours
    server.start(models)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ok = len(argv) == 1 or (len(argv) == 3 and argv[1] == "--worker" and argv[2].isdigit())
    if not ok:
        print(
            "usage: python -m pipeline.runtimes.kserve.runtime <run_dir>/kserve.json "
            "[--worker SLOT]",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    conf = Path(argv[0])
    worker = Worker(conf, int(argv[2])) if len(argv) == 3 else None
    try:
        serve(RuntimeConfig.read(conf), conf.parent, worker)
    except (PipelineError, IntegrityError) as err:  # a model it must not or cannot load
        log.error("%s", err)  # the reason in one line, which the supervisor's exit names
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
