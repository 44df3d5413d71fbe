"""The KServe runtime's gRPC servicer with versions (pipeline.runtimes.kserve.versioned):
a version that is not loaded is NOT_FOUND on ModelReady, ModelMetadata and ModelInfer, as
REST's 404 (ModelReady answered OK with ready=false), and it reaches the client through
kserve's exception interceptor with no ERROR line (`context.abort` in the servicer logged
"Internal server error" and "Abort already called!"). Over the wire, with Triton's client:
tests/integration/test_kserve_interop.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from pipeline.serving import live
from pipeline_runtime import oip


@pytest.fixture(scope="module")
def kv():
    """The module, imported with pytest's arguments hidden from kserve."""
    return oip.kserve_module("pipeline.runtimes.kserve.versioned")


@pytest.fixture(scope="module")
def pb():
    return oip.kserve_module("kserve.protocol.grpc.grpc_predict_v2_pb2")


def _servicer(kv) -> Any:
    """Model "m" with versions 1 and 2 loaded, in kserve's own repository and data plane."""
    repository = oip.kserve_module("kserve.model_repository").ModelRepository()
    dataplane = oip.kserve_module("kserve.protocol.dataplane")
    # The loaded versions' numbers are all the servicer reads of them.
    model = kv.VersionedModel("m", live.ModelVersions({}, 1), {1: None, 2: None})
    repository.update(model)
    return kv.VersionedServicer({"m": model}, dataplane.DataPlane(repository), None)


def test_a_loaded_version_is_ready_and_one_not_loaded_is_not_found(kv, pb) -> None:
    from grpc_interceptor.exceptions import NotFound

    servicer = _servicer(kv)
    for version in ("", "2"):
        ready = asyncio.run(
            servicer.ModelReady(pb.ModelReadyRequest(name="m", version=version), None)
        )
        assert ready.ready
    for call in (
        servicer.ModelReady(pb.ModelReadyRequest(name="m", version="9"), None),
        servicer.ModelMetadata(pb.ModelMetadataRequest(name="m", version="9"), None),
        servicer.ModelInfer(pb.ModelInferRequest(model_name="m", model_version="9"), None),
    ):
        with pytest.raises(NotFound) as err:
            asyncio.run(call)
        assert err.value.details == "Model 'm' has no version '9'; it serves 1, 2."


class _Context:
    """What kserve's interceptor calls of a gRPC call's context: abort, once."""

    def __init__(self) -> None:
        self.aborted: list[tuple[grpc.StatusCode, str]] = []

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        if self.aborted:
            raise AssertionError("Abort already called!")
        self.aborted.append((code, details))
        raise grpc.aio.AbortError()


@pytest.mark.parametrize(
    ("method", "request_of"),
    [
        ("ModelReady", lambda pb: pb.ModelReadyRequest(name="m", version="9")),
        ("ModelMetadata", lambda pb: pb.ModelMetadataRequest(name="m", version="9")),
        ("ModelInfer", lambda pb: pb.ModelInferRequest(model_name="m", model_version="9")),
    ],
)
def test_kserves_interceptor_answers_not_found_without_an_error_line(
    kv, pb, method: str, request_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    interceptors = oip.kserve_module("kserve.protocol.grpc.interceptors")
    servicer, context = _servicer(kv), _Context()
    # The interceptor as the gRPC server calls it (runtime.py installs kserve's own).
    call = interceptors.ExceptionToStatusInterceptor().intercept(
        getattr(servicer, method), request_of(pb), context, f"/inference.Service/{method}"
    )
    kserve_log = logging.getLogger("kserve")  # kserve's log config may not propagate it
    kserve_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO), pytest.raises(grpc.aio.AbortError):
            asyncio.run(call)
    finally:
        kserve_log.removeHandler(caplog.handler)
    assert [code for code, _ in context.aborted] == [grpc.StatusCode.NOT_FOUND]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_clients_unknown_model_or_bad_request_is_one_info_line_not_an_error(
    kv, caplog: pytest.LogCaptureFixture
) -> None:
    # kserve's interceptor logged each as ERROR with its traceback.
    errors = oip.kserve_module("kserve.errors")
    models = oip.kserve_module("pipeline.runtimes.kserve.models")
    for ex, code in (
        (errors.ModelNotFound("nope"), grpc.StatusCode.NOT_FOUND),
        (models.Refused("No output named ['w']"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.InvalidInput("contents and raw_input_contents"), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        context = _Context()
        caplog.clear()
        handled = kv.ClientErrorsInterceptor().handle_exception(ex, None, context, "/M/Infer")
        with caplog.at_level(logging.INFO), pytest.raises(grpc.aio.AbortError):
            asyncio.run(handled)
        assert context.aborted == [(code, str(ex))]
        assert [r.levelno for r in caplog.records] == [logging.INFO], caplog.text
        assert str(ex) in caplog.records[0].getMessage()


def test_a_rest_version_is_a_canonical_number_or_a_404_never_a_500(kv) -> None:
    """REST's pick took "02" as version 2 (TorchServe says 404), and "²" passed isdigit()
    and failed int(): a 500 on /v2/models/m/versions/%C2%B2/infer."""
    model = kv.VersionedModel("m", live.ModelVersions({}, 1), {1: "one", 2: "two"})
    assert model.pick("2") == "two" and model.pick(None) == "one"
    for version in ("02", "²", "٣", "0", "-1", "2.0", " 2"):
        with pytest.raises(kv.Refused) as err:
            model.pick(version)
        assert err.value.status == 404, version
        assert str(err.value) == f"Model 'm' has no version {version!r}; it serves 1, 2.", version
