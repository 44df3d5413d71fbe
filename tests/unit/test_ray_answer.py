"""The Ray ingress's answers (pipeline/runtimes/ray/answer.py): the outputs asked for, each
in JSON or binary as asked; an unknown name refused. Before, the ingress answered every
output in JSON or all in binary, and 200 with all of them for a name the model lacks.
On a real cluster: tests/integration/test_ray_runtime.py."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pipeline.runtimes.ray.answer import encode, plan
from pipeline_runtime import oip
from pipeline_runtime.asked import AskedError

NAMES = ["y", "z"]
ARRAYS = [np.arange(4, dtype=np.float32).reshape(2, 2) / 3, np.array([1, 0], dtype=np.int64)]
META = {"model_name": "m", "model_version": "1"}


def _request(**body: Any) -> oip.Request:
    x = {"name": "x", "shape": [1], "datatype": "FP32", "data": [0.5]}
    return oip.Request.from_rest(json.dumps({"inputs": [x], **body}).encode(), None)


def _read(content: bytes, length: int | None) -> dict[str, np.ndarray]:
    return oip.Response.from_rest(content, length).arrays()


def test_without_outputs_named_every_output_is_answered_in_json() -> None:
    content, length = encode(_request(id="r1"), META, NAMES, ARRAYS)
    assert length is None
    body = json.loads(content)
    assert [o["name"] for o in body["outputs"]] == NAMES and body["id"] == "r1"
    assert body["model_name"] == "m" and body["model_version"] == "1"
    for got, want in zip(_read(content, length).values(), ARRAYS, strict=True):
        np.testing.assert_array_equal(got, want)


def test_only_the_outputs_asked_are_answered_in_the_order_asked() -> None:
    content, length = encode(_request(outputs=[{"name": "z"}]), META, NAMES, ARRAYS)
    answer = _read(content, length)
    assert list(answer) == ["z"]
    np.testing.assert_array_equal(answer["z"], ARRAYS[1])


def test_binary_is_chosen_per_output_and_defaults_to_the_requests_parameter() -> None:
    mixed = _request(outputs=[{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}])
    content, length = encode(mixed, META, NAMES, ARRAYS)
    assert length is not None
    items = json.loads(content[:length])["outputs"]
    assert "data" not in items[0] and items[0]["parameters"]["binary_data_size"] == 16
    assert items[1]["data"] == [1, 0]
    answer = _read(content, length)
    np.testing.assert_array_equal(answer["y"], ARRAYS[0])
    all_binary = _request(parameters={"binary_data_output": True})
    content, length = encode(all_binary, META, NAMES, ARRAYS)
    assert length is not None and len(content) == length + 16 + 16
    assert all("data" not in o for o in json.loads(content[:length])["outputs"])


def test_an_output_the_model_lacks_is_refused_naming_what_it_has() -> None:
    with pytest.raises(AskedError, match=r"No output named \['w'\]; this model has"):
        plan(_request(outputs=[{"name": "y"}, {"name": "w"}]), NAMES)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"parameters": {"binary_data_output": "false"}}, "'binary_data_output'"),
        ({"outputs": [{"name": "y", "parameters": {"binary_data": "false"}}]}, "'binary_data'"),
        ({"outputs": [{"name": "z", "parameters": {"binary_data": 0}}]}, "of output 'z'"),
    ],
)
def test_a_binary_flag_that_is_not_a_boolean_is_refused_naming_it(body: dict, named: str) -> None:
    # The string "false" was truthy: the answer came in binary.
    with pytest.raises(AskedError, match="must be true or false") as err:
        plan(_request(**body), NAMES)
    assert named in str(err.value) and "got " in str(err.value)
    with pytest.raises(AskedError):
        encode(_request(**body), META, NAMES, ARRAYS)


def test_the_classification_extension_is_refused_not_ignored() -> None:
    # tritonclient's class_count=2: the full tensor came back as if it were the top 2.
    request = _request(outputs=[{"name": "y", "parameters": {"classification": 2}}])
    with pytest.raises(AskedError, match="classification extension is not supported"):
        plan(request, NAMES)


def test_the_models_failure_is_a_json_500_saying_the_error_not_the_replicas_traceback() -> None:
    """A model that raised answered Serve's own text 500 (no JSON message), unlike every
    other runtime. The ingress, without Serve: its request path up to the replica's answer."""
    import asyncio

    from ray.exceptions import RayTaskError
    from starlette.requests import Request

    from pipeline.runtimes.ray.app import Ingress
    from pipeline.runtimes.ray.availability import Availability
    from pipeline.serving import guard
    from pipeline_runtime import codec

    async def failed(arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        remote = 'Traceback (most recent call last):\n  File "/srv/app.py", line 9, in forward'
        raise RayTaskError("handle_request", remote, IndexError("index 99 is out of bounds"))

    class Handle:  # the deployment handle's one call the ingress makes
        def remote(self, arrays: dict[str, np.ndarray]) -> Any:
            return failed(arrays)

    ingress = object.__new__(Ingress.func_or_class)
    ingress.available = object.__new__(Availability)
    ingress.available.down = {}
    ingress.limit, ingress.handles = guard.BodyLimit(1 << 20), {"m": Handle()}
    spec = codec.InputSpec("x", ("batch", 1), "float32")
    model = {"specs": [spec], "limits": codec.Limits(), "outputs": ["y"]}
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}
    ).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "headers": []}
    answer = asyncio.run(ingress._infer(Request(scope, receive), "m", model))
    assert answer.status_code == 500 and answer.media_type == "application/json"
    assert json.loads(answer.body) == {
        "error": "Inference failed: IndexError: index 99 is out of bounds"
    }


def test_a_non_finite_output_is_json_null_not_infinity() -> None:
    """json.dumps wrote Infinity and NaN, which strict JSON parsers refuse."""
    arrays = [np.array([[np.inf, -np.inf], [np.nan, 1.0]], dtype=np.float32), ARRAYS[1]]
    content, length = encode(_request(), META, NAMES, arrays)
    assert length is None
    body = json.loads(content, parse_constant=lambda word: pytest.fail(f"{word} in the answer"))
    assert body["outputs"][0]["data"] == [None, None, None, 1.0]
