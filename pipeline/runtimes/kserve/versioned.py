"""A served model's versions inside one KServe runtime worker, and the watcher that
keeps them as the run folder's live state says (pipeline.serving.live).

`VersionedModel` is what kserve's repository holds under a model's name: REST
(`fastpath.FastInfer`) and gRPC (kserve's servicer, `model_version`) ask it for the
version a request names, or, unversioned, for the default or the canary's share.
`Watcher` polls the live state; a change loads the new versions (off the event loop,
warmed up before any request reaches them), then moves the routing in one step,
then drops the versions no longer wanted once their in-flight requests are done, and
acknowledges. Import after kserve (runtime.py hides sys.argv from kserve's import).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import kserve
from grpc_interceptor.exceptions import NotFound
from kserve.errors import InvalidInput, ModelNotFound
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.servicer import InferenceServicer

from pipeline.core.signing import version_number
from pipeline.runtimes.kserve.config import ServedExport
from pipeline.runtimes.kserve.models import ExportModel, Refused
from pipeline.serving import live

log = logging.getLogger("pipeline.runtimes.kserve")

# This worker's answers per (served name, version), written to the run folder for
# `pipeline rollout`'s canary check (every worker writes its own file).
TALLIES: dict[tuple[str, int], live.Tally] = {}


def tally(name: str, version: int, started: float, ok: bool) -> None:
    key = (name, version)
    TALLIES.setdefault(key, live.Tally()).add((time.perf_counter() - started) * 1000.0, ok)


class VersionedModel(kserve.Model):
    """Every loaded version of one served model, and where unversioned requests go."""

    def __init__(self, name: str, state: live.ModelVersions, loaded: dict[int, ExportModel]):
        super().__init__(name)
        self.state, self.loaded = state, loaded
        self.splitter = live.Splitter()
        self.ready = True

    @property
    def default(self) -> ExportModel:
        return self.loaded[self.state.default]

    def versions(self) -> list[str]:
        return [str(v) for v in sorted(self.loaded)]

    def pick(self, version: str | None) -> ExportModel:
        """The version a request names, else the default (or the canary, for its share)."""
        if version:
            # Only a canonical number: "02" is no version ("2" is; TorchServe says 404 too),
            # and "²" passed isdigit() and failed int() (a 500).
            number = version_number(version)
            found = self.loaded.get(number) if number is not None else None
            if found is None:
                raise Refused(
                    f"Model {self.name!r} has no version {version!r}; it serves "
                    f"{', '.join(self.versions())}.",
                    404,
                )
            return found
        canary = self.state.canary
        if canary in self.loaded and self.splitter.to_canary(self.state.percent):
            return self.loaded[canary]
        return self.default

    def metadata(self, version: str) -> dict[str, Any]:
        """The Open Inference Protocol's model metadata of one version."""
        one = self.pick(version)
        return {
            "name": self.name,
            "versions": self.versions(),
            "platform": one.platform,
            "inputs": one.get_input_types(),
            "outputs": one.get_output_types(),
        }

    def record(self, version: int, started: float, ok: bool) -> None:
        tally(self.name, version, started, ok)

    # kserve's metadata of the unversioned model: the default version's tensors.
    def get_input_types(self) -> list[dict[str, Any]]:
        return self.default.get_input_types()

    def get_output_types(self) -> list[dict[str, Any]]:
        return self.default.get_output_types()

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        asked = getattr(payload, "model_version", None) or None
        target = self.pick(asked)
        started, ok = time.perf_counter(), False
        try:
            answer = await target.predict(payload, headers)
            ok = True
            return answer
        except Refused:
            ok = True  # the client's fault: no mark against the version
            raise
        finally:
            if asked is None:  # the split's traffic: what a canary is judged on
                self.record(target.version, started, ok)


class Watcher:
    """Applies the run folder's live state to this worker's models (see the module doc)."""

    def __init__(
        self,
        run_dir: Path,
        slot: int,
        models: dict[str, VersionedModel],
        load: Callable[[ServedExport], ExportModel],
    ) -> None:
        self.run_dir, self.slot, self.models, self.load = Path(run_dir), slot, models, load
        self._draining: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        await live.follow(self.run_dir, self.slot, TALLIES, self.apply)

    async def apply(self, state: live.LiveState) -> str | None:
        """Load what is new, move the routing, drop what is gone; the first error, or None."""
        loop = asyncio.get_running_loop()
        for name, wanted in state.models.items():
            model = self.models.get(name)
            if model is None:
                return f"this server does not serve {name!r}; it serves {sorted(self.models)}"
            for number, where in sorted(wanted.versions.items()):
                if number in model.loaded:
                    continue
                served = ServedExport(name, where.export_dir, where.format, version=number)
                TALLIES.pop((name, number), None)  # a version loaded again starts afresh
                try:
                    model.loaded[number] = await loop.run_in_executor(None, self.load, served)
                except Exception as err:  # reported to the rollout, which undoes it
                    log.exception("loading %s version %d failed", name, number)
                    return f"loading {name} version {number} failed: {type(err).__name__}: {err}"
            model.state = wanted  # one assignment: each request sees the old or the new split
            for number in sorted(set(model.loaded) - set(wanted.versions)):
                task = loop.create_task(self._drop(model, model.loaded.pop(number)))
                self._draining.add(task)
                task.add_done_callback(self._draining.discard)
        return None

    async def _drop(self, model: VersionedModel, old: ExportModel) -> None:
        """Let the requests already on `old` finish (they hold it), then let it go."""
        while old.inflight:
            await asyncio.sleep(0.01)
        await old.batcher.close()  # its idle task held the model: now nothing does
        log.info("%s version %d unloaded (no request in flight)", model.name, old.version)


class VersionedServicer(InferenceServicer):
    """kserve's gRPC servicer, with model versions: ModelReady, ModelMetadata and ModelInfer
    answer for the version asked, NOT_FOUND for one not loaded, as REST's 404 (kserve ignores
    `version`: any version was "ready"), and the metadata lists the loaded versions (kserve
    leaves `versions` empty).

    NOT_FOUND is raised as grpc_interceptor's NotFound, which kserve's exception interceptor
    hands on as that status without a log line: `context.abort` here raised an AbortError
    that the interceptor took for a server error, logged with its traceback and aborted
    again ("Abort already called!")."""

    def __init__(self, models: dict[str, VersionedModel], *args: Any) -> None:
        super().__init__(*args)
        self.models = models

    def _check_loaded(self, name: str, version: str) -> None:
        """NotFound when `name` is served and `version` is not one of its loaded versions
        (a model not served is kserve's own NOT_FOUND)."""
        model = self.models.get(name)
        if model is not None and version and version not in model.versions():
            raise NotFound(
                f"Model {name!r} has no version {version!r}; it serves "
                f"{', '.join(model.versions())}."
            )

    async def ModelReady(  # noqa: N802 - the gRPC method's name
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        self._check_loaded(request.name, request.version)
        return await super().ModelReady(request, context)

    async def ModelMetadata(  # noqa: N802 - the gRPC method's name
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        self._check_loaded(request.name, request.version)
        answer = await super().ModelMetadata(request, context)
        model = self.models.get(request.name)
        if model is not None:
            answer.versions.extend(model.versions())
        return answer

    async def ModelInfer(  # noqa: N802 - the gRPC method's name
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        # kserve said INVALID_ARGUMENT for a version not loaded.
        self._check_loaded(request.model_name, request.model_version)
        return await super().ModelInfer(request, context)


class ClientErrorsInterceptor(ExceptionToStatusInterceptor):
    """kserve's exception interceptor, a client's errors said in one INFO line: kserve logs
    an unknown model and every refused request (InvalidInput, Refused) as ERROR with its
    traceback, which reads as the server failing. The statuses stay kserve's."""

    async def handle_exception(
        self, ex: Exception, request_or_iterator: Any, context: Any, method_name: str
    ) -> None:
        if isinstance(ex, ModelNotFound):
            status = grpc.StatusCode.NOT_FOUND
        elif isinstance(ex, InvalidInput):
            status = grpc.StatusCode.INVALID_ARGUMENT
        else:
            await super().handle_exception(ex, request_or_iterator, context, method_name)
            return
        log.info("%s refused (%s): %s", method_name, status.name, ex)
        await context.abort(status, str(ex))
