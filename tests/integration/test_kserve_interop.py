"""The KServe runtime with Open Inference Protocol clients we did not write.

Triton's client library (`tritonclient` HTTP, with JSON and binary tensors each
way, and gRPC) and kserve's own REST and gRPC clients, unmodified (Triton's gRPC client in a
process of its own: `tests/triton_grpc.py` says why), against a
real runtime on 127.0.0.1 serving the digits CNN in every format: each answer
equals the export's eager outputs within its tolerance, and health, readiness
and metadata answer as the protocol says, for the server and per model. The same
server serves the int8/float16 formats, which verify holds to their accuracy budget.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as thttp

from pipeline.export import ExportResult
from pipeline.export.opened import open_export
from pipeline.runtimes.kserve.config import RuntimeConfig
from pipeline.runtimes.kserve.launch import served_export, start
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import INFERENCE_KEY_FILE, Server
from pipeline_runtime import oip
from tests.conftest import SERVED_FORMATS, SERVED_PRECISION_FORMATS
from tests.integration.conftest import DETECTOR_BATCHES, RECURRENT


def _kserve():
    """kserve and its REST client's settings (imported with sys.argv hidden from kserve)."""
    return oip.kserve_module("kserve"), oip.kserve_module("kserve.inference_client").RESTConfig


@pytest.fixture(scope="module")
def server(
    detector: dict[str, Any],  # first: built here while test_formats' worker builds the rest
    two_stage: dict[str, Any],
    exported: ExportResult,
    precision_exported: ExportResult,
    recurrent: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
):
    run_dir = tmp_path_factory.mktemp("interop_run")
    # The int8/float16 formats too, from their own export: served like any other format.
    reduced = [
        served_export(precision_exported.out_dir, f, name=f"digits_{f}")
        for f in SERVED_PRECISION_FORMATS
    ]
    # And the recurrent models' .pt2 (nn.LSTM / nn.GRU as scan, sequence axis dynamic).
    scanned = [
        served_export(Path(r["export_dir"]), "pt2", name=f"{name}_pt2")
        for name, r in recurrent.items()
    ]
    # And a detector (per-sample outputs), whose 320×320 images as JSON are ~6 MB each.
    detections = [
        served_export(Path(made["export_dir"]), f, name=f"{name}_{f}")
        for name, made in (("detector", detector), ("two_stage", two_stage))
        for f in ("torchscript", "onnx")
    ]
    config = RuntimeConfig(
        models=[served_export(exported.out_dir, f, name=f"digits_{f}") for f in SERVED_FORMATS]
        + reduced
        + scanned
        + detections,
        http_port=free_port(),
        grpc_port=free_port(),
        max_request_size=64 * 2**20,
    )
    try:
        yield start(config, run_dir)
    finally:
        stop(run_dir)


@pytest.fixture(scope="module")
def golden(exported: ExportResult) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    opened = open_export(exported.out_dir)
    inputs, outputs = opened.golden()
    (x,) = inputs.values()
    (y,) = outputs.values()
    tol = opened.manifest.tolerance
    return x.numpy(), y.numpy(), (tol.atol, tol.rtol)


def _key(server: Server) -> str:
    return json.loads((Path(server.run_dir) / INFERENCE_KEY_FILE).read_text())["inference"]["key"]


def _auth(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {_key(server)}"}


def _grpc_auth(server: Server) -> dict[str, str]:
    return {"authorization": f"Bearer {_key(server)}"}  # gRPC metadata keys are lowercase


def _hostport(server: Server) -> str:
    return server.inference_url.removeprefix("http://")


def _grpc_hostport(server: Server) -> str:
    return server.extras["grpc_url"].removeprefix("grpc://")


def _input_name(exported: ExportResult) -> str:
    return open_export(exported.out_dir).manifest.inputs[0].name


def _output_name(exported: ExportResult) -> str:
    return open_export(exported.out_dir).manifest.output_names[0]


def _close(got: np.ndarray, golden) -> None:
    _, y, (atol, rtol) = golden
    assert got.shape == y.shape
    np.testing.assert_allclose(got, y, atol=atol, rtol=rtol)


# (inputs binary, outputs binary): JSON both ways is what failed with a 400
# (the client sends JSON with no Content-Type).
HTTP_MODES = {"json": (False, False), "binary-in": (True, False), "binary-out": (False, True),
              "binary": (True, True)}  # fmt: skip


@pytest.mark.parametrize("fmt", SERVED_FORMATS)
@pytest.mark.parametrize("mode", HTTP_MODES)
def test_tritonclient_http(server, exported, golden, fmt: str, mode: str) -> None:
    binary_in, binary_out = HTTP_MODES[mode]
    x = golden[0]
    client = thttp.InferenceServerClient(_hostport(server))
    try:
        tensor = thttp.InferInput(_input_name(exported), list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary_in)
        wanted = thttp.InferRequestedOutput(_output_name(exported), binary_data=binary_out)
        result = client.infer(f"digits_{fmt}", [tensor], outputs=[wanted], headers=_auth(server))
        _close(result.as_numpy(_output_name(exported)), golden)
    finally:
        client.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_compressed_requests(server, exported, golden, algorithm, binary) -> None:
    """Triton's client compresses the body when asked (Content-Encoding); Triton's server
    and this runtime inflate it first."""
    x = golden[0]
    client = thttp.InferenceServerClient(_hostport(server))
    try:
        tensor = thttp.InferInput(_input_name(exported), list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        result = client.infer(
            "digits_onnx", [tensor], headers=_auth(server), request_compression_algorithm=algorithm
        )
        _close(result.as_numpy(_output_name(exported)), golden)
    finally:
        client.close()


def test_bodies_that_do_not_decode_get_a_4xx_and_the_server_keeps_serving(
    server, exported, golden
) -> None:
    import gzip

    url = f"{server.inference_url}/v2/models/digits_onnx/infer"
    plain = json.dumps({"inputs": [{"name": _input_name(exported), "datatype": "FP32",
                                    "shape": list(golden[0].shape),
                                    "data": golden[0].ravel().tolist()}]}).encode()  # fmt: skip
    limit = 64 * 2**20
    bomb = gzip.compress(b" " * (limit + 1), compresslevel=9)  # far over 100:1
    cases = [
        (plain, "gzip", 400, "does not decode as gzip"),  # labelled gzip, sent plain
        (gzip.compress(plain)[:-8], "gzip", 400, "ends early"),  # truncated
        (bomb, "gzip", 413, "over the server's limit"),
        (plain, "br", 415, "Content-Encoding 'br' is not supported"),
    ]
    for body, encoding, status, said in cases:
        r = httpx.post(
            url, content=body, timeout=60,
            headers={**_auth(server), "Content-Type": "application/json", "Content-Encoding": encoding},
        )  # fmt: skip
        assert (r.status_code, said in r.json()["error"]) == (status, True), (encoding, r.text)
    r = httpx.post(url, content=gzip.compress(plain), timeout=60,
                   headers={**_auth(server), "Content-Encoding": "gzip"})  # fmt: skip
    assert r.status_code == 200
    _close(np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(golden[1].shape), golden)


def _triton_grpc(server: Server, *args: str | Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.triton_grpc", args[0], _grpc_hostport(server),
         _key(server), *map(str, args[1:])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("fmt", SERVED_FORMATS)
def test_tritonclient_grpc(server, exported, golden, fmt: str, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", golden[0])
    _triton_grpc(
        server, "infer", f"digits_{fmt}", _input_name(exported), tmp_path / "x.npy",
        _output_name(exported), tmp_path / "y.npy",
    )  # fmt: skip
    _close(np.load(tmp_path / "y.npy"), golden)


@pytest.mark.parametrize("fmt", SERVED_FORMATS)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_kserve_rest_client(server, exported, golden, fmt: str, binary: bool) -> None:
    kserve, rest_config = _kserve()
    x = golden[0]

    async def go() -> np.ndarray:
        tensor = kserve.InferInput(_input_name(exported), list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        request = kserve.InferRequest(f"digits_{fmt}", infer_inputs=[tensor])
        client = kserve.InferenceRESTClient(rest_config(protocol="v2", retries=0))
        try:
            response = await client.infer(
                server.inference_url, request, model_name=f"digits_{fmt}", headers=_auth(server)
            )
        finally:
            await client.close()
        return response.outputs[0].as_numpy()

    _close(asyncio.run(go()), golden)


@pytest.mark.parametrize("fmt", SERVED_FORMATS)
def test_kserve_grpc_client(server, exported, golden, fmt: str) -> None:
    kserve, _ = _kserve()
    x = golden[0]

    async def go() -> np.ndarray:
        tensor = kserve.InferInput(_input_name(exported), list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        request = kserve.InferRequest(f"digits_{fmt}", infer_inputs=[tensor])
        client = kserve.InferenceGRPCClient(_grpc_hostport(server))
        try:
            response = await client.infer(request, headers=tuple(_grpc_auth(server).items()))
        finally:
            await client.close()
        return response.outputs[0].as_numpy()

    _close(asyncio.run(go()), golden)


def test_health_readiness_and_metadata_over_http(server, exported) -> None:
    client = thttp.InferenceServerClient(_hostport(server))
    auth = _auth(server)
    try:
        assert client.is_server_live() and client.is_server_ready()
        meta = client.get_server_metadata(headers=auth)
        assert meta["name"] and meta["version"]
        # kserve listed model_repository_extension, whose routes answer 404 here; the
        # binary tensor extension is offered (the fast path reads and writes it).
        assert meta["extensions"] == ["binary_tensor_data"]
        for fmt in SERVED_FORMATS:
            name = f"digits_{fmt}"
            assert client.is_model_ready(name, headers=auth)
            model = client.get_model_metadata(name, headers=auth)
            assert model["name"] == name and model["platform"]
            (tensor,) = model["inputs"]
            assert tensor["name"] == _input_name(exported) and tensor["datatype"] == "FP32"
            assert tensor["shape"][0] == -1  # the batch axis is dynamic
            assert [o["name"] for o in model["outputs"]] == [_output_name(exported)]
        assert not client.is_model_ready("no_such_model", headers=auth)
    finally:
        client.close()


def test_health_readiness_and_metadata_over_grpc(server, exported) -> None:
    names = [f"digits_{fmt}" for fmt in SERVED_FORMATS]
    described = json.loads(_triton_grpc(server, "describe", *names, "no_such_model"))
    assert described["live"] and described["ready"]
    for name in names:
        model = described["models"][name]
        assert model["ready"], model
        meta = model["metadata"]
        assert meta["name"] == name and meta["platform"], meta
        assert [t["name"] for t in meta["inputs"]] == [_input_name(exported)]
        assert int(meta["inputs"][0]["shape"][0]) == -1
    assert described["models"]["no_such_model"] == {"error": "StatusCode.NOT_FOUND"}


# Issue 28 saw one valid binary request from Triton's client refused once with 400 ("the
# JSON header ... is not JSON: unexpected end of data" at about the header's length), by
# a parser this runtime no longer has. What could cut a body short is sent here, many
# times over: kept-alive and fresh connections, concurrent requests on a client's pool,
# chunked bodies, and bodies written a few bytes at a time (parsed before fully read?).
def _binary_body(name: str, x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    raw = np.ascontiguousarray(x, dtype="<f4").tobytes()
    header = json.dumps(
        {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                     "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()  # fmt: skip
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def test_a_thousand_and_more_binary_requests_are_all_answered(server, exported, golden) -> None:
    x, name = golden[0], _input_name(exported)
    url = f"{server.inference_url}/v2/models/digits_onnx/infer"
    body, headers = _binary_body(name, x)
    headers = {**headers, **_auth(server)}
    statuses: list[int] = []

    # Triton's client: one kept-alive connection, then its pool of 8 with async requests.
    for concurrency in (1, 8):
        client = thttp.InferenceServerClient(_hostport(server), concurrency=concurrency)
        try:
            tensor = thttp.InferInput(name, list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            if concurrency == 1:
                results = [
                    client.infer("digits_onnx", [tensor], headers=_auth(server))
                    for _ in range(1000)
                ]
            else:
                pending = [
                    client.async_infer("digits_onnx", [tensor], headers=_auth(server))
                    for _ in range(200)  # the pool is slow (16 ms a request): enough to overlap
                ]
                results = [p.get_result() for p in pending]
            for result in results:
                _close(result.as_numpy(_output_name(exported)), golden)
                statuses.append(200)
        finally:
            client.close()
    # A fresh connection per request, and chunked bodies (no Content-Length).
    for i in range(100):
        with httpx.Client(timeout=30) as fresh:
            content = iter([body[:50], body[50:]]) if i % 2 else body
            statuses.append(fresh.post(url, content=content, headers=headers).status_code)
    # The body in 7-byte writes, each flushed on its own.
    host, port = server.inference_url.removeprefix("http://").rsplit(":", 1)
    request = (
        f"POST /v2/models/digits_onnx/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Length: {len(body)}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + "\r\n"
    ).encode() + body
    for _ in range(10):
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(0, len(request), 7):
                s.sendall(request[i : i + 7])
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += s.recv(65536)
            statuses.append(int(answer.split(b" ", 2)[1]))
    assert statuses == [200] * len(statuses), sorted(set(statuses))
    assert len(statuses) == 1310


def test_the_intermittent_400_is_tritonclients_left_over_length_header(
    server, exported, golden
) -> None:
    """Issue 28's 400 ("... (char 171)"), reproduced: Triton's HTTP client writes
    Inference-Header-Content-Length into the headers dict it is given and leaves it there,
    so a JSON request after a binary one with the same dict carries the binary header's
    length (171 bytes in the issue). The answer is a 400 that says so; a fresh dict is answered."""
    x, name = golden[0], _input_name(exported)
    client = thttp.InferenceServerClient(_hostport(server))

    def tensor(binary: bool) -> thttp.InferInput:
        t = thttp.InferInput(name, list(x.shape), "FP32")
        return t.set_data_from_numpy(x, binary_data=binary)

    out = [thttp.InferRequestedOutput(_output_name(exported), binary_data=False)]
    try:
        shared = _auth(server)
        client.infer("digits_onnx", [tensor(True)], outputs=out, headers=shared)
        assert "Inference-Header-Content-Length" in shared  # the client's doing
        with pytest.raises(thttp.InferenceServerException) as err:
            client.infer("digits_onnx", [tensor(False)], outputs=out, headers=shared)
        assert err.value.status() == "400"
        assert "left over from an earlier binary request" in err.value.message()
        # The same two calls, each with its own dict, and the server still serves.
        for binary in (True, False):
            result = client.infer(
                "digits_onnx", [tensor(binary)], outputs=out, headers=_auth(server)
            )
            _close(result.as_numpy(_output_name(exported)), golden)
    finally:
        client.close()


@pytest.mark.parametrize("key", SERVED_PRECISION_FORMATS)
def test_reduced_precision_formats_serve_and_verify_holds_them_to_their_budget(
    server: Server, precision_exported: ExportResult, key: str, tmp_path: Path
) -> None:
    """`verify --backend kserve` over REST and gRPC on an int8/float16 format: judged at task
    level (the export's accuracy budget), not elementwise."""
    from pipeline.serving.backends import ServedBackend
    from pipeline.verify import VerifyConfig, verify

    manifest = precision_exported.manifest
    served = [ServedBackend(server, f"digits_{key}", key, manifest, t) for t in ("rest", "grpc")]
    report = verify(
        VerifyConfig(
            model="digits_lenet",
            export_dir=precision_exported.out_dir,
            backends=("kserve",),
            report=tmp_path / "parity.json",
            page=False,
        ),
        served=served,
    )
    assert report.passed, report.failure_message()
    rows = [r for r in report.rows if r.backend != "golden file"]
    assert {r.backend for r in rows} == {b.name for b in served}
    assert all(r.task is not None for r in rows)  # task level, with its bound printed


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_pt2_answers_tritonclient_at_other_sequence_lengths(
    server: Server, recurrent: dict[str, dict[str, Any]], name: str
) -> None:
    """The .pt2 of an nn.LSTM tagger (INT64 tokens) and an nn.GRU encoder, served by the
    runtime, equal eager at sequence lengths 1 and 3× the example's, over Triton's client."""
    opened = open_export(Path(recurrent[name]["export_dir"]))
    (spec,) = opened.entry.inputs
    (output,) = opened.manifest.output_names
    example = int(next(iter(opened.golden()[0].values())).shape[1])
    client = thttp.InferenceServerClient(_hostport(server))
    try:
        for length in (1, 3 * example):
            inputs = opened.entry.sample_inputs(
                opened.entry.sizes(batch=2, seq=length), torch.Generator().manual_seed(length)
            )
            x = inputs[spec.name].numpy()
            tensor = thttp.InferInput(spec.name, list(x.shape), oip.datatype_of(x.dtype))
            tensor.set_data_from_numpy(x, binary_data=True)
            result = client.infer(f"{name}_pt2", [tensor], headers=_auth(server))
            expected = opened.eager(inputs)[output].numpy()
            np.testing.assert_allclose(result.as_numpy(output), expected, atol=1e-4, rtol=1e-3)
    finally:
        client.close()


@pytest.mark.parametrize("data", [[1.5, 2, 3], [1e300, 2, 3]], ids=["fraction", "too-big"])
def test_int64_tokens_it_cannot_hold_are_a_400_not_a_cast(server: Server, data: list) -> None:
    """OIP JSON values an INT64 input cannot hold are refused (codec.oip_arrays, the reader
    TorchServe's handler shares), where numpy's cast served 1.5 as 1; then a good request."""
    url = f"{server.inference_url}/v2/models/lstm_tagger_pt2/infer"
    headers = {**_auth(server), "Content-Type": "application/json"}

    def body(values: list) -> bytes:
        item = {"name": "tokens", "shape": [1, 3], "datatype": "INT64", "data": values}
        return json.dumps({"inputs": [item]}).encode()

    r = httpx.post(url, content=body(data), headers=headers, timeout=60)
    assert r.status_code == 400, r.text
    assert "int64" in r.json()["error"]
    assert httpx.post(url, content=body([1, 2, 3]), headers=headers, timeout=60).status_code == 200


@pytest.mark.parametrize("made", ["detector", "two_stage"])
def test_served_detections_pass_the_detection_rule_over_rest_grpc_and_tritonclient(
    server: Server, made: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each detector's boxes, scores, labels and counts (one named output per field,
    batch-major, with per-image counts: docs/kserve.md) over REST and gRPC, held to the
    detection rule by verify; and read by Triton's client as a user would."""
    from pipeline.serving.backends import ServedBackend
    from pipeline.verify import VerifyConfig, verify

    detector = request.getfixturevalue(made)

    export_dir = Path(detector["export_dir"])
    opened = open_export(export_dir)
    served = [
        ServedBackend(server, f"{made}_{f}", f, opened.manifest, t)
        for f in ("torchscript", "onnx")
        for t in ("rest", "grpc")
    ]
    config = VerifyConfig(
        model=detector["model"],
        export_dir=export_dir,
        backends=("kserve",),
        report=tmp_path / "parity.json",
        page=False,
        batch_sizes=DETECTOR_BATCHES,
    )
    report = verify(config, served=served)
    assert report.passed, report.failure_message()
    assert {r.backend for r in report.rows if r.backend != "golden file"} == {
        b.name for b in served
    }
    inputs = opened.sample(2, seed=7)
    x = inputs["images"].numpy()
    client = thttp.InferenceServerClient(_hostport(server))
    try:
        tensor = thttp.InferInput("images", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        result = client.infer(f"{made}_torchscript", [tensor], headers=_auth(server))
        # One image without its batch axis: its detections whole and counts a scalar (a
        # user's trial got its first box alone, and a 500 for an image with none).
        tensor = thttp.InferInput("images", list(x[1].shape), "FP32")
        tensor.set_data_from_numpy(x[1], binary_data=True)
        single = client.infer(f"{made}_torchscript", [tensor], headers=_auth(server))
    finally:
        client.close()
    counts = result.as_numpy("counts")
    expected = opened.eager(inputs)
    assert counts.tolist() == expected["counts"].tolist()
    assert result.as_numpy("boxes").shape == (int(counts.sum()), 4)
    assert result.as_numpy("labels").dtype == np.int64
    assert single.as_numpy("counts").shape == () and int(single.as_numpy("counts")) == counts[1]
    assert single.as_numpy("boxes").shape == (int(counts[1]), 4)


# Triton's gRPC client (in a process of its own: tests/triton_grpc.py says why) making the
# calls in argv[3], a JSON list; prints what each got: its outputs' names, its readiness, or
# its status and message.
_TRITON_GRPC_CALLS = """
import json, sys
import numpy as np
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

url, token, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
headers = {"authorization": f"Bearer {token}"}
client = tgrpc.InferenceServerClient(url)
said = []
for c in calls:
    try:
        if "ready" in c:
            said.append({"ready": client.is_model_ready(c["model"], c["ready"], headers=headers)})
            continue
        x = np.load(c["source"])
        tensor = tgrpc.InferInput(c["input"], list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        asked = [tgrpc.InferRequestedOutput(n, class_count=k) for n, k in c["outputs"]]
        result = client.infer(c["model"], [tensor], outputs=asked, headers=headers)
        said.append({"outputs": [o.name for o in result.get_response().outputs]})
    except InferenceServerException as err:
        said.append({"error": err.status(), "message": err.message()})
client.close()
print(json.dumps(said))
"""


def _kserve_log(server: Server) -> str:
    return (Path(server.run_dir) / "logs" / "kserve.out").read_text()


def test_tritonclient_grpc_is_refused_what_rest_refuses_and_no_error_is_logged(
    server: Server, exported: ExportResult, golden, detector: dict[str, Any], tmp_path: Path
) -> None:
    """gRPC as REST: an output the model lacks and Triton's classification extension
    (class_count) are INVALID_ARGUMENT with REST's message (both were OK, with every output),
    only the outputs asked are answered (every one was), a version not loaded is NOT_FOUND
    on ModelReady (it was OK, ready=false); and a client's error logs no ERROR (a NOT_FOUND
    logged "Internal server error" and "Abort already called!")."""
    opened = open_export(Path(detector["export_dir"]))
    np.save(tmp_path / "x.npy", golden[0])
    np.save(tmp_path / "images.npy", opened.sample(1, seed=3)["images"].numpy())
    digits = {
        "model": "digits_onnx",
        "input": _input_name(exported),
        "source": str(tmp_path / "x.npy"),
    }
    images = {"model": "detector_onnx", "input": "images", "source": str(tmp_path / "images.npy")}
    out = _output_name(exported)
    calls = [
        {**digits, "outputs": [["nope", 0]]},
        {**digits, "outputs": [[out, 3]]},
        {**images, "outputs": [["counts", 0], ["boxes", 0]]},
        {"model": "digits_onnx", "ready": "9"},
        {"model": "digits_onnx", "ready": "1"},
        {**digits, "outputs": []},  # and it keeps serving
    ]
    logged = len(_kserve_log(server))
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_GRPC_CALLS, _grpc_hostport(server), _key(server),
         json.dumps(calls)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    unknown, classified, asked, ready_9, ready_1, plain = json.loads(proc.stdout)
    assert unknown == {
        "error": "StatusCode.INVALID_ARGUMENT",
        "message": f"No output named ['nope']; this model has ['{out}'].",
    }
    assert classified["error"] == "StatusCode.INVALID_ARGUMENT", classified
    assert "classification extension is not supported" in classified["message"]
    assert asked == {"outputs": ["counts", "boxes"]}
    assert ready_9["error"] == "StatusCode.NOT_FOUND", ready_9
    assert "has no version '9'" in ready_9["message"]
    assert ready_1 == {"ready": True} and plain == {"outputs": [out]}
    said = _kserve_log(server)[logged:]
    assert " ERROR " not in said and "Abort already called" not in said, said


def test_rest_refuses_class_count_and_binary_flags_that_are_not_booleans(
    server: Server, exported: ExportResult, golden
) -> None:
    """Triton's classification extension over REST (tritonclient.http's class_count) is a 400
    saying so (the full tensor came back); `"binary_data_output": "false"` (a string) is a 400
    naming it (it was taken as true); a version's route of a model not served is a 404
    (kserve's 501); and a client's 404 logs no ERROR traceback."""
    x = golden[0]
    out = _output_name(exported)
    client = thttp.InferenceServerClient(_hostport(server))
    try:
        tensor = thttp.InferInput(_input_name(exported), list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        asked = [thttp.InferRequestedOutput(out, class_count=3)]
        with pytest.raises(thttp.InferenceServerException) as err:
            client.infer("digits_onnx", [tensor], outputs=asked, headers=_auth(server))
        assert err.value.status() == "400" and "classification extension" in err.value.message()
    finally:
        client.close()
    url = f"{server.inference_url}/v2/models/digits_onnx/infer"
    item = {"name": _input_name(exported), "shape": list(x.shape), "datatype": "FP32",
            "data": x.ravel().tolist()}  # fmt: skip
    logged = len(_kserve_log(server))
    for parameters, outputs, named in (
        ({"binary_data_output": "false"}, [], "'binary_data_output'"),
        ({}, [{"name": out, "parameters": {"binary_data": "false"}}], "'binary_data' of output"),
    ):
        body = {"inputs": [item], "parameters": parameters, "outputs": outputs}
        r = httpx.post(url, json=body, headers=_auth(server), timeout=60)
        assert r.status_code == 400 and named in r.json()["error"], r.text
        assert "got 'false' (str)" in r.json()["error"]
    for path in ("/v2/models/no_such_model/versions/1/ready", "/v2/models/no_such_model/ready"):
        r = httpx.get(server.inference_url + path, headers=_auth(server))
        assert r.status_code == 404 and "does not exist" in r.json()["error"], (path, r.text)
    said = _kserve_log(server)[logged:]
    assert " ERROR " not in said and "Traceback" not in said, said
    r = httpx.post(url, json={"inputs": [item]}, headers=_auth(server), timeout=60)
    assert r.status_code == 200 and r.json()["outputs"][0]["name"] == out
