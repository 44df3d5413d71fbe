"""The KServe runtime process: `python -m pipeline.runtimes.kserve.runtime <run_dir>/kserve.json`.

With `--worker SLOT` it is one of the supervisor's workers (supervisor.py): it binds
the HTTP port with SO_REUSEPORT beside the others and answers /v2/health/ready with 200
only once every worker has warmed up. Without it, one process alone (the deploy image).

A real kserve 0.21 `ModelServer` serving one model per export over the Open
Inference Protocol (REST `/v2/...` and gRPC), each model loaded with
`open_export(dir).load(format)` — the Runner verify uses — and warmed up on
the export's golden inputs before the server opens its ports, so
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

import logging
import math
import os
import socket
import sys
import uuid
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
    from kserve.errors import InvalidInput
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
    from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor, LoggingInterceptor
    from kserve.protocol.grpc.servicer import InferenceServicer
finally:
    sys.argv = _ARGV

import numpy as np  # noqa: E402
import torch  # noqa: E402
from prometheus_client import Gauge, Histogram  # noqa: E402

from pipeline.export.opened import open_export  # noqa: E402
from pipeline.formats import base as formats  # noqa: E402
from pipeline.runtimes.kserve import binary  # noqa: E402
from pipeline.runtimes.kserve.batching import Batcher  # noqa: E402
from pipeline.runtimes.kserve.config import RuntimeConfig, ServedExport  # noqa: E402
from pipeline.runtimes.kserve.fastpath import ClientError, FastInfer  # noqa: E402
from pipeline.runtimes.kserve.security import Guard, TokenInterceptor  # noqa: E402
from pipeline.runtimes.kserve.supervisor import all_ready_marker, ready_marker  # noqa: E402
from pipeline.serving.guard import Keys  # noqa: E402
from pipeline_runtime import codec, oip  # noqa: E402
from pipeline_runtime.request import MAX_ELEMENTS, SAMPLES_PER_BATCH  # noqa: E402

log = logging.getLogger("pipeline.runtimes.kserve")

BATCH_SIZE = Histogram(
    "pipeline_kserve_batch_size",
    "Requests per forward pass (dynamic batching)",
    ["model_name"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
WARMED = Gauge("pipeline_kserve_warmed_up", "1 once the model ran its warm-up", ["model_name"])
# Which process answered a scrape: each worker has its own registry (batch sizes included).
WORKER = Gauge("pipeline_kserve_worker", "1 per runtime process: its slot and pid", ["slot", "pid"])
GRACE_S = 5  # seconds the servers get to finish requests on SIGTERM


class Refused(InvalidInput, ClientError):  # noqa: N818 - the name tests and docs use
    """A client error with its own HTTP status (413 for too many samples); gRPC: INVALID_ARGUMENT.
    kserve's routes know it as InvalidInput, the fast REST route as ClientError."""

    def __init__(self, reason: str, status: int = 400) -> None:
        InvalidInput.__init__(self, reason)
        self.status = status


class ExportModel(kserve.Model):
    """One export, served under `served.name`."""

    def __init__(self, served: ServedExport, config: RuntimeConfig) -> None:
        super().__init__(served.name)
        exported = open_export(Path(served.export_dir))
        manifest = exported.manifest
        self.format = served.format
        self.platform = formats.get(served.format).platform
        self.runner = exported.load(served.format, "cpu", config.threads)
        self.specs = manifest.input_specs(served.format)
        self.output_specs = manifest.outputs
        self.output_names = manifest.output_names
        self.limits = codec.Limits(max_samples=SAMPLES_PER_BATCH * max(1, config.max_batch_size))
        histogram = BATCH_SIZE.labels(model_name=served.name)
        self.batcher = Batcher(
            forward=self._forward,
            input_axes={s.name: s.batch_axis for s in self.specs},
            output_axes=[o.batch_axis or 0 for o in manifest.outputs],
            max_batch_size=config.max_batch_size,
            max_delay_ms=config.max_batch_delay_ms,
            stack=manifest.serving.stack_requests,
            on_batch=histogram.observe,
        )
        golden, _ = exported.golden()
        self._forward(codec.warm_up_inputs({k: v.numpy() for k, v in golden.items()}, self.specs))
        WARMED.labels(model_name=served.name).set(1)
        log.info("%s (%s, %s) loaded and warmed up", served.name, served.format, served.export_dir)
        self.ready = True

    def _forward(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            outputs = self.runner({k: torch.from_numpy(v) for k, v in batch.items()})
        return [t.detach().cpu().numpy() for t in outputs.values()]

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
        as_numpy) → checked arrays with their batch axis, and whether they had none."""
        names = [s.name for s in self.specs]
        got = [i.name for i in tensors]
        if sorted(map(str, got)) != sorted(names):
            raise Refused(f"Inputs must be named {names}, got {got}.")
        by_name = {s.name: s for s in self.specs}
        arrays = {}
        for item in tensors:
            spec = by_name[item.name]
            wanted = oip.NAMES.get(spec.dtype)
            if item.datatype != wanted:
                raise Refused(
                    f"Input {spec.name!r}: datatype must be {wanted}, got {item.datatype!r}."
                )
            shape = item.shape
            if (
                not isinstance(shape, list | tuple)
                or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
                or any(d < 1 for d in shape)
                or len(shape) > len(spec.shape)
                or math.prod(shape) > MAX_ELEMENTS
            ):
                raise Refused(
                    f"Input {spec.name!r}: shape {shape} is empty, negative, too large or has "
                    f"too many dimensions; expected {list(spec.shape)}."
                )
            try:
                # A copy: binary tensors are read-only views of the request body.
                arrays[spec.name] = np.array(item.as_numpy())
            except (InvalidInput, ClientError):
                raise
            except Exception as err:  # noqa: BLE001 - a bad tensor is this request's 400
                raise Refused(
                    f"Input {spec.name!r}: data does not match shape {list(shape)} and datatype "
                    f"{item.datatype} ({type(err).__name__}: {err})."
                ) from None
        try:
            return codec.check_arrays(arrays, self.specs, self.limits)
        except codec.RequestError as err:
            raise Refused(str(err), 413 if err.status == 413 else 400) from None

    async def run(self, arrays: dict[str, np.ndarray], unbatched: bool) -> list[np.ndarray]:
        """Checked arrays through the batcher → the outputs, in the request's own shape."""
        outputs = await self.batcher.submit(arrays)
        return [o[0] if o.ndim else o for o in outputs] if unbatched else outputs

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        outputs = await self.run(*self.decode(payload))
        response = oip.Response(
            tuple(
                oip.Tensor.from_array(n, o) for n, o in zip(self.output_names, outputs, strict=True)
            ),
            id=payload.id or str(uuid.uuid4()),
            model_name=self.name,
        )
        return binary.infer_response(response, payload.use_binary_outputs, payload.request_outputs)


def _describe(name: str, dtype: str, shape: Any) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": oip.datatype_of(dtype) if dtype else "FP32",
        "shape": [-1 if isinstance(d, str) else int(d) for d in shape],
    }


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


def _install(config: RuntimeConfig, models: list[ExportModel], worker: Worker | None) -> None:
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
                return JSONResponse({"ready": warm}, status_code=200 if warm else 503)

            # Registered first, so it answers instead of kserve's (always ready).
            app.add_api_route("/v2/health/ready", ready, methods=["GET"])
            super()._register_endpoints(app)

        def create_application(self) -> None:
            super().create_application()
            app = ksms.app
            for exc in (RequestValidationError, ValueError, KeyError, TypeError):
                app.add_exception_handler(exc, _bad_request)
            app.add_exception_handler(Refused, _refused)
            # Added first, so it runs inside the Guard: the token and size checks stay first.
            app.add_middleware(FastInfer, models={m.name: m for m in models})
            app.add_middleware(Guard, keys=keys, max_body=config.max_request_size, host=config.host)

        async def start(self) -> None:
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
            interceptors = [LoggingInterceptor(), ExceptionToStatusInterceptor()]
            if keys is not None:
                interceptors.insert(0, TokenInterceptor(keys))
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
                InferenceServicer(self._data_plane, self._model_repository_extension),
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
    _install_platform({m.name: m.platform for m in models})


def _install_platform(platforms: dict[str, str]) -> None:
    """Model metadata names the model's platform, as the protocol asks (kserve sends "")."""
    original = DataPlane.model_metadata

    async def model_metadata(self: DataPlane, model_name: str) -> dict[str, Any]:
        meta = await original(self, model_name)
        return {**meta, "platform": platforms.get(model_name, meta.get("platform", ""))}

    DataPlane.model_metadata = model_metadata  # type: ignore[method-assign]


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


def serve(config: RuntimeConfig, worker: Worker | None = None) -> None:
    """Serve `config.models` until SIGTERM; `worker`: as one of the supervisor's workers."""
    torch.set_num_threads(max(1, config.threads))
    models = [ExportModel(m, config) for m in config.models]
    if worker is not None:
        WORKER.labels(slot=str(worker.slot), pid=str(os.getpid())).set(1)
    _install(config, models, worker)
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
    serve(RuntimeConfig.read(conf), Worker(conf, int(argv[2])) if len(argv) == 3 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
