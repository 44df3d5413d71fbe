"""The KServe runtime's REST infer route without FastAPI (pipeline.runtimes.kserve.fastpath).

The binary tensor extension's rule: a body is binary exactly when the
Inference-Header-Content-Length header is there, whatever the Content-Type.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from pipeline.runtimes.kserve.fastpath import ClientError, FastInfer, encode, parse
from pipeline_runtime import oip

X = np.arange(6, dtype=np.float32).reshape(2, 3) / 7


def _json_body(x: np.ndarray = X, **extra: Any) -> bytes:
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    return json.dumps({"inputs": [tensor], **extra}).encode()


def _binary_body(x: np.ndarray = X) -> tuple[bytes, int]:
    return oip.Request((oip.Tensor.from_array("x", x),)).to_rest(binary=True)


def test_a_body_without_the_length_header_is_json_whatever_its_content_type() -> None:
    request = parse(_json_body(), {b"content-type": b"application/octet-stream"})
    np.testing.assert_array_equal(request.inputs[0].as_numpy(), X)
    assert parse(_json_body(), {}).inputs[0].shape == (2, 3)


def test_a_body_with_the_length_header_is_binary_and_read_in_place() -> None:
    body, length = _binary_body()
    request = parse(body, {b"inference-header-content-length": str(length).encode()})
    np.testing.assert_array_equal(request.inputs[0].as_numpy(), X)
    assert not isinstance(request.inputs[0].data, list)  # never a per-element list


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (b"", {}, "has no body"),
        (b"\x00\x01binary", {}, "binary tensors need the Inference-Header-Content-Length"),
        (b'{"inputs": [', {}, "The body is not JSON: unexpected end of data"),
        # The JSON parser's own words were misleading for these (a user's trial):
        (b'{"inputs": [{"data": [NaN]}]}', {}, "holds NaN, Infinity or a number past float64"),
        (b'{"inputs": [{"data": [1e400]}]}', {}, "holds NaN, Infinity or a number past float64"),
        (b"\xff\xfe\x00garbage", {}, "takes a JSON request"),
        (b'{"inputs": 3}', {}, "Malformed request"),
        (b"{}", {b"inference-header-content-length": b"abc"}, "is not a number"),
        (b"{}", {b"inference-header-content-length": b"9"}, "is 9; the body has 2 bytes"),
        (b"{}", {b"inference-header-content-length": b"0"}, "is 0; the body has 2 bytes"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": '
         b'{"binary_data_size": 8}}]}\x00\x00', None, "8 bytes announced, 2 left"),
    ],
)  # fmt: skip
def test_malformed_bodies_are_client_errors(body: bytes, headers: Any, message: str) -> None:
    if headers is None:  # the JSON part's own length, the rest too short
        headers = {b"inference-header-content-length": str(len(body) - 2).encode()}
    with pytest.raises(ClientError, match=message) as err:
        parse(body, headers)
    assert err.value.status == 400


def test_a_json_body_with_a_left_over_length_header_is_a_400_that_names_the_cause() -> None:
    # Issue 28's intermittent 400: Triton's client keeps the binary request's length in
    # the caller's headers dict, so the next JSON request carries it (see fastpath).
    body = _json_body()
    binary_header = len(_binary_body()[0]) - X.nbytes
    with pytest.raises(ClientError, match="left over from an earlier binary request") as err:
        parse(body, {b"inference-header-content-length": str(binary_header).encode()})
    assert err.value.status == 400 and "fresh dict" in err.value.reason
    # kserve's own REST client keeps it in the caller's dict too (a user's trial).
    assert "kserve's InferenceRESTClient" in err.value.reason
    # A body that is not JSON as a whole keeps the plain message.
    with pytest.raises(ClientError, match="The body is not JSON: ") as err:
        parse(body[:-1], {b"inference-header-content-length": str(binary_header).encode()})


class _Model:
    """A served model's part FastInfer uses: checks inputs, returns two outputs."""

    def __init__(self, version: int = 1) -> None:
        self.name, self.output_names, self.calls = "m", ["y", "z"], 0
        self.version = version
        self.observed: list[str] = []
        self.request_ids: list[str] = []  # what FastInfer hands the model (the shadow check's)

    def check(self, tensors: Any) -> tuple[dict[str, np.ndarray], bool]:
        if [t.name for t in tensors] != ["x"]:
            raise ClientError("Inputs must be named ['x'].")
        return {"x": tensors[0].as_numpy()}, False

    def observe(self, stage: str, seconds: float) -> None:
        self.observed.append(stage)

    async def run(
        self, arrays: dict[str, np.ndarray], unbatched: bool, request_id: str = ""
    ) -> list[np.ndarray]:
        self.calls += 1
        self.request_ids.append(request_id)
        x = arrays["x"]
        return [x * 2, (x > 0.3).astype(np.int64)]


class _Versions:
    """A served model's versions as FastInfer sees them: the named one, else the default."""

    def __init__(self, *numbers: int) -> None:
        self.by_number = {n: _Model(n) for n in numbers or (1,)}
        self.default = min(self.by_number)
        self.recorded: list[tuple[int, bool]] = []

    def pick(self, version: str | None) -> _Model:
        if version is None:
            return self.by_number[self.default]
        if not version.isdigit() or int(version) not in self.by_number:
            raise ClientError(f"no version {version!r}", 404)
        return self.by_number[int(version)]

    def metadata(self, version: str) -> dict[str, Any]:
        return {
            "name": "m",
            "versions": sorted(map(str, self.by_number)),
            "at": self.pick(version).version,
        }

    def record(self, version: int, started: float, ok: bool) -> None:
        self.recorded.append((version, ok))


def _request(**body: Any) -> oip.Request:
    return parse(_json_body(**body), {})


def test_answers_are_json_numbers_from_the_arrays() -> None:
    answer, length = encode(_request(id="r1"), _Model(), [X * 2, np.ones((2,), np.int64)])
    assert length is None
    parsed = json.loads(answer)
    assert parsed["id"] == "r1" and parsed["model_name"] == "m"
    y, z = parsed["outputs"]
    assert (y["name"], y["datatype"], y["shape"]) == ("y", "FP32", [2, 3])
    np.testing.assert_array_equal(np.asarray(y["data"], np.float32).reshape(2, 3), X * 2)
    assert (z["datatype"], z["data"]) == ("INT64", [1, 1])


def test_a_0d_output_keeps_its_empty_shape_in_json_and_binary() -> None:
    # An image's detection count sent without its batch axis: ascontiguousarray made it
    # [1], and clients then refused an answer not shaped as it says.
    count = np.int64(3)
    for asked in ({}, {"parameters": {"binary_data_output": True}}):
        answer, length = encode(_request(**asked), _Model(), [X * 2, count])
        header = json.loads(answer[:length] if length else answer)
        assert header["outputs"][1]["shape"] == [], header


def test_binary_outputs_when_asked_per_output_or_for_all() -> None:
    outputs = [X * 2, np.ones((2,), np.int64)]
    asked = _request(outputs=[{"name": "z", "parameters": {"binary_data": True}}])
    answer, length = encode(asked, _Model(), outputs)
    assert length is not None and b'"data"' not in answer[:length]  # z went as bytes
    response = oip.Response.from_rest(answer, length)
    assert [t.name for t in response.outputs] == ["z"]  # only what was asked for
    np.testing.assert_array_equal(response.outputs[0].as_numpy(), outputs[1])

    every = _request(parameters={"binary_data_output": True})
    answer, length = encode(every, _Model(), outputs)
    response = oip.Response.from_rest(answer, length)
    np.testing.assert_array_equal(response.outputs[0].as_numpy(), outputs[0])
    assert length is not None and b'"data"' not in answer[:length]


def test_an_unknown_output_is_a_client_error() -> None:
    with pytest.raises(ClientError, match=r"No output named \['w'\]"):
        encode(_request(outputs=[{"name": "w"}]), _Model(), [X, X])


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"parameters": {"binary_data_output": "false"}}, "'binary_data_output'"),
        ({"outputs": [{"name": "y", "parameters": {"binary_data": "false"}}]}, "of output 'y'"),
        ({"outputs": [{"name": "z", "parameters": {"binary_data": 1}}]}, "of output 'z'"),
    ],
)
def test_a_binary_flag_that_is_not_a_boolean_is_a_400_naming_it(body: dict, named: str) -> None:
    # The string "false" was truthy: the answer came in binary.
    with pytest.raises(ClientError, match="must be true or false") as err:
        encode(_request(**body), _Model(), [X, X])
    assert err.value.status == 400 and named in err.value.reason and "got " in err.value.reason


def test_what_the_answer_cannot_be_is_a_400_before_the_model_runs() -> None:
    """An unknown output, the classification extension (tritonclient's class_count: the full
    tensor came back, as if it were the top N) and a binary flag not a boolean."""
    for outputs, parameters, said in (
        ([{"name": "w"}], {}, "No output named ['w']; this model has ['y', 'z']."),
        ([{"name": "y", "parameters": {"classification": 3}}], {}, "classification extension"),
        ([], {"binary_data_output": "false"}, "'binary_data_output' must be true or false"),
    ):
        model = _Model()
        app = FastInfer(None, {"m": _Versions()})  # type: ignore[arg-type]
        app.models["m"].by_number[1] = model
        body = _json_body(outputs=outputs, parameters=parameters)
        start, message = _asgi(app, "/v2/models/m/infer", [{"type": "http.request", "body": body}])
        assert start["status"] == 400 and said in json.loads(message["body"])["error"]
        assert model.calls == 0, said  # refused before the forward pass


def _asgi(app: FastInfer, path: str, messages: list[dict], headers: list | None = None):
    sent: list[dict] = []
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    asyncio.run(app(scope, receive, send))
    return sent


def _passed_through() -> tuple[FastInfer, list[str]]:
    seen: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    return FastInfer(inner, {"m": _Versions()}), seen


def test_the_route_of_a_served_model_is_answered_from_a_body_in_several_messages() -> None:
    app, seen = _passed_through()
    body = _json_body()
    chunks = [{"type": "http.request", "body": body[:10], "more_body": True},
              {"type": "http.request", "body": body[10:], "more_body": False}]  # fmt: skip
    start, message = _asgi(app, "/v2/models/m/infer", chunks)
    assert start["status"] == 200 and not seen
    assert json.loads(message["body"])["outputs"][0]["name"] == "y"


def test_other_routes_and_models_go_to_kserve() -> None:
    app, seen = _passed_through()
    for path in ("/v2/models/other/infer", "/v2/models/m", "/v2/health/ready"):
        assert _asgi(app, path, []) == []
    assert seen == ["/v2/models/other/infer", "/v2/models/m", "/v2/health/ready"]


def test_a_bad_request_is_a_json_4xx_and_a_client_gone_gets_nothing() -> None:
    app, _ = _passed_through()
    start, message = _asgi(app, "/v2/models/m/infer", [{"type": "http.request", "body": b"{"}])
    assert start["status"] == 400 and "not JSON" in json.loads(message["body"])["error"]
    assert _asgi(app, "/v2/models/m/infer", [{"type": "http.disconnect"}]) == []


def test_an_asked_outputs_parameters_not_an_object_is_a_400_not_the_models_fault() -> None:
    # It reached the answer's encoding and failed there, which said 500.
    app, _ = _passed_through()
    body = _json_body(outputs=[{"name": "y", "parameters": [1]}])
    start, message = _asgi(app, "/v2/models/m/infer", [{"type": "http.request", "body": body}])
    assert start["status"] == 400 and "'outputs' must" in json.loads(message["body"])["error"]


def test_a_named_version_answers_and_says_so_and_an_unknown_one_is_a_404() -> None:
    versions = _Versions(1, 2)
    app = FastInfer(None, {"m": versions})  # type: ignore[arg-type]  # nothing passes through
    body = [{"type": "http.request", "body": _json_body()}]
    start, message = _asgi(app, "/v2/models/m/versions/2/infer", body)
    assert start["status"] == 200 and json.loads(message["body"])["model_version"] == "2"
    start, message = _asgi(app, "/v2/models/m/infer", body)
    assert json.loads(message["body"])["model_version"] == "1"  # unversioned: the default
    start, message = _asgi(app, "/v2/models/m/versions/3/infer", body)
    assert start["status"] == 404 and "no version '3'" in json.loads(message["body"])["error"]
    # Only the unversioned request counts: a canary is judged on the traffic split to it.
    assert versions.recorded == [(1, True)]


def test_a_versions_metadata_and_readiness_are_answered_here() -> None:
    app = FastInfer(None, {"m": _Versions(1, 2)})  # type: ignore[arg-type]

    def get(path: str) -> tuple[int, dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        asyncio.run(app({"type": "http", "method": "GET", "path": path}, None, send))  # type: ignore[arg-type]
        return sent[0]["status"], json.loads(sent[1]["body"])

    assert get("/v2/models/m/versions/2") == (200, {"name": "m", "versions": ["1", "2"], "at": 2})
    assert get("/v2/models/m/versions/2/ready") == (200, {"name": "m", "ready": True})
    status, body = get("/v2/models/m/versions/9/ready")
    assert status == 404 and "no version" in body["error"]


def test_a_versions_route_of_a_model_not_served_is_a_404_not_kserves_501() -> None:
    # kserve answered "Model versioning not supported yet." with 501: a 5xx for a client's
    # typo. Unversioned routes of unknown models stay kserve's (404 already).
    app, seen = _passed_through()

    async def send(message: dict) -> None:
        sent.append(message)

    for method, path in (
        ("GET", "/v2/models/nope/versions/9/ready"),
        ("GET", "/v2/models/nope/versions/1"),
        ("POST", "/v2/models/nope/versions/1/infer"),
    ):
        sent: list[dict] = []
        asyncio.run(app({"type": "http", "method": method, "path": path}, None, send))  # type: ignore[arg-type]
        assert sent[0]["status"] == 404, path
        assert json.loads(sent[1]["body"]) == {"error": "Model with name nope does not exist."}
    assert not seen
    assert _asgi(app, "/v2/models/nope/infer", []) == [] and seen == ["/v2/models/nope/infer"]


def test_a_request_without_an_id_gets_one_id_for_its_answer_and_its_shadow_sample() -> None:
    # The answer carried a generated id while the shadow check's sample (and its log line)
    # had none ("request id -"), so a divergence could not be tied to the answer.
    versions = _Versions()
    app = FastInfer(_passed_through()[0].app, {"m": versions})
    sent = []
    for body in (_json_body(), _json_body(id="mine-1")):
        _, message = _asgi(app, "/v2/models/m/infer", [{"type": "http.request", "body": body}])
        sent.append(json.loads(message["body"])["id"])
    handed = versions.by_number[1].request_ids
    assert handed == sent and handed[1] == "mine-1" and handed[0], (handed, sent)


class _Failing(_Model):
    async def run(self, arrays: dict, unbatched: bool, request_id: str = "") -> list:
        raise RuntimeError(  # what a TorchScript model raises: the server's source and paths
            "The following operation failed in the TorchScript interpreter.\n"
            "Traceback of TorchScript (most recent call last):\n"
            '  File "/srv/models/m/code.py", line 4, in forward\n'
            "    return x.view(3, 7)\n"
            "RuntimeError: shape '[3, 7]' is invalid for input of size 10\n"
        )


def test_the_models_failure_is_a_json_500_saying_the_error_not_its_traceback() -> None:
    versions = _Versions()
    versions.by_number[1] = _Failing()
    app = FastInfer(_passed_through()[0].app, {"m": versions})
    body = _json_body()
    start, message = _asgi(app, "/v2/models/m/infer", [{"type": "http.request", "body": body}])
    assert start["status"] == 500 and versions.recorded == [(1, False)]
    assert json.loads(message["body"]) == {
        "error": "Inference failed: RuntimeError: shape '[3, 7]' is invalid for input of size 10"
    }
