"""Which body verify's served requests carry (`Protocol.infer`): JSON for small inputs,
the protocol's binary form for big ones where the server reads it. The request is
caught at `client.post`, the one place every protocol sends from; the servers' reading
of both forms is tested against real servers (test_formats, test_kserve_interop)."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
import torch

from pipeline.runtimes.torchserve.protocol import PROTOCOL as TORCHSERVE
from pipeline.serving import client
from pipeline.serving.openinference import OpenInference
from pipeline.serving.protocol import BINARY_FROM_BYTES, wants_binary
from pipeline.serving.wire import HEADER_LENGTH

SMALL = {"image": torch.rand(1, 1, 8, 8)}  # the digits CNN's input: 256 bytes
IMAGE = {"images": torch.rand(1, 3, 320, 320)}  # a detector's: 1.2 MB of float32


def test_the_threshold_counts_every_input_s_bytes() -> None:
    assert not wants_binary(SMALL)
    assert wants_binary(IMAGE)
    half = BINARY_FROM_BYTES // 8  # float64 elements
    assert not wants_binary({"a": torch.zeros(half - 1, dtype=torch.float64)})
    assert wants_binary(
        {"a": torch.zeros(half // 2, dtype=torch.float64), "b": torch.zeros(half // 2 + 1, 8)}
    )


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, str, dict]]:
    """What infer posts, answered with one output as each runtime answers it."""
    requests: list[tuple[bytes, str, dict]] = []

    def post(server, name, body, content_type="application/json", **kwargs):
        requests.append((body, content_type, kwargs))
        if kwargs.get("headers") is None and name == "ts":
            return httpx.Response(200, json={"outputs": {"y": [1.5]}})
        answer = {"outputs": [{"name": "y", "shape": [1], "datatype": "FP32", "data": [1.5]}]}
        return httpx.Response(200, json=answer)

    monkeypatch.setattr(client, "post", post)
    return requests


def test_torchserve_sends_small_inputs_as_json_and_big_ones_as_numpy(sent) -> None:
    assert TORCHSERVE.infer(None, "ts", SMALL)["y"].tolist() == [1.5]  # type: ignore[arg-type]
    body, content_type, _ = sent[-1]
    assert content_type == "application/json"
    assert json.loads(body)["inputs"]["image"] == SMALL["image"].tolist()

    TORCHSERVE.infer(None, "ts", IMAGE)  # type: ignore[arg-type]
    body, content_type, _ = sent[-1]
    assert content_type == "application/octet-stream"
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), IMAGE["images"].numpy())

    two = {"a": IMAGE["images"], "b": torch.arange(3)}
    TORCHSERVE.infer(None, "ts", two)  # type: ignore[arg-type]
    with np.load(io.BytesIO(sent[-1][0])) as saved:  # an .npz keeps names and dtypes
        assert sorted(saved.files) == ["a", "b"] and saved["b"].dtype == np.int64


def test_open_inference_goes_binary_only_where_the_server_reads_it(sent) -> None:
    oip = OpenInference()
    assert oip.infer(None, "m", SMALL)["y"].tolist() == [1.5]  # type: ignore[arg-type]
    assert sent[-1][1] == "application/json"

    oip.infer(None, "m", IMAGE)  # type: ignore[arg-type]
    body, content_type, kwargs = sent[-1]
    assert content_type == "application/octet-stream"
    length = int(kwargs["headers"][HEADER_LENGTH])
    header = json.loads(body[:length])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == IMAGE["images"].nbytes
    assert len(body) == length + IMAGE["images"].nbytes

    json_only = OpenInference(encodings=("json",))  # the tests' toy runtime
    json_only.infer(None, "m", IMAGE)  # type: ignore[arg-type]
    assert sent[-1][1] == "application/json"
