"""`pipeline serve --runtime kserve`: a real kserve ModelServer on 127.0.0.1.

One server for the module (started by a fixture and always stopped) serves
the digits CNN's ONNX and TorchScript artifacts and the tutorial gate, whose
manifest says `serving.stack_requests: false`. It runs with a 50 ms batch
delay so that concurrent requests are stacked deterministically enough to
see it on /metrics.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import torch

from pipeline.export import ExportResult
from pipeline.export.opened import open_export
from pipeline.runtimes.kserve.config import RuntimeConfig
from pipeline.runtimes.kserve.launch import served_export, start
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import INFERENCE_KEY_FILE, SERVER_FILE, Server
from pipeline_runtime import oip
from tests.conftest import run_cli
from tests.manifest_reads import counted

DIGITS = "digits_lenet"
DIGITS_TS = "digits_lenet_ts"
GATE = "my_decision_gate"


def _stubs():
    """kserve's gRPC stubs (imported with sys.argv hidden from kserve)."""
    pb = oip.kserve_module("kserve.protocol.grpc.grpc_predict_v2_pb2")
    return pb, oip.kserve_module("kserve.protocol.grpc.grpc_predict_v2_pb2_grpc")


@pytest.fixture(scope="module")
def gate(family: dict[str, ExportResult]) -> ExportResult:
    """The session's trained and exported gate (served as TorchScript, the default)."""
    return family[GATE]


@pytest.fixture(scope="module")
def server(exported: ExportResult, gate: ExportResult, tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp("kserve_run")
    config = RuntimeConfig(
        models=[
            served_export(exported.out_dir, "onnx"),
            served_export(exported.out_dir, "torchscript", name=DIGITS_TS),
            served_export(gate.out_dir),
        ],
        http_port=free_port(),
        grpc_port=free_port(),
        max_batch_size=8,
        max_batch_delay_ms=50,
    )
    try:
        yield start(config, run_dir)
    finally:
        stop(run_dir)


def _key(server: Server) -> str:
    return json.loads((Path(server.run_dir) / INFERENCE_KEY_FILE).read_text())["inference"]["key"]


def _auth(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {_key(server)}"}


def _v2(name: str, x: np.ndarray) -> dict:
    return {
        "inputs": [
            {
                "name": name,
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.reshape(-1).tolist(),
            }
        ]
    }


def _infer(server: Server, model: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server.inference_url}/v2/models/{model}/infer",
        json=body,
        headers={**_auth(server), **headers},
        timeout=30,
    )


def _check(answer: dict, expected: torch.Tensor, manifest) -> None:
    out = answer["outputs"][0]
    got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    tol = manifest.tolerance
    np.testing.assert_allclose(got, expected.numpy(), atol=tol.atol, rtol=tol.rtol)


def _histogram(server: Server, model: str) -> tuple[float, float]:
    text = httpx.get(f"{server.inference_url}/metrics", headers=_auth(server)).text
    values = {}
    for kind in ("count", "sum"):
        m = re.search(
            rf'^pipeline_kserve_batch_size_{kind}{{model_name="{model}"}} (\S+)$', text, re.M
        )
        values[kind] = float(m.group(1)) if m else 0.0
    return values["count"], values["sum"]


@pytest.mark.parametrize("model", [DIGITS, DIGITS_TS])
def test_rest_infer_equals_eager(server: Server, exported: ExportResult, model: str) -> None:
    opened = open_export(exported.out_dir)
    inputs, outputs = opened.golden()
    ((name, x),) = inputs.items()
    r = _infer(server, model, _v2(name, x.numpy()))
    assert r.status_code == 200, r.text
    _check(r.json(), next(iter(outputs.values())), opened.manifest)
    meta = httpx.get(f"{server.inference_url}/v2/models/{model}", headers=_auth(server)).json()
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]


def test_grpc_infer_equals_eager_and_needs_the_token(
    server: Server, exported: ExportResult
) -> None:
    import grpc

    pb, pbg = _stubs()
    opened = open_export(exported.out_dir)
    inputs, outputs = opened.golden()
    x = next(iter(inputs.values())).numpy().astype(np.float32)
    request = pb.ModelInferRequest(
        model_name=DIGITS,
        inputs=[
            pb.ModelInferRequest.InferInputTensor(name="image", datatype="FP32", shape=x.shape)
        ],
        raw_input_contents=[x.tobytes()],
    )
    with grpc.insecure_channel(server.extras["grpc_url"]) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(
            request, metadata=[("authorization", f"Bearer {_key(server)}")], timeout=30
        )
        got = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(
            reply.outputs[0].shape
        )
        expected = next(iter(outputs.values())).numpy()
        tol = opened.manifest.tolerance
        np.testing.assert_allclose(got, expected, atol=tol.atol, rtol=tol.rtol)
        for metadata in ([], [("authorization", "Bearer wrong")]):
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(request, metadata=metadata, timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bad = pb.ModelInferRequest(
            model_name=DIGITS,
            inputs=[
                pb.ModelInferRequest.InferInputTensor(name="image", datatype="FP32", shape=[1, 3])
            ],
            raw_input_contents=[np.zeros(3, np.float32).tobytes()],
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(bad, metadata=[("authorization", f"Bearer {_key(server)}")])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("token", [None, "wrong"])
def test_token_required(server: Server, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = _v2("image", np.zeros((1, 1, 28, 28), np.float32))
    # /metrics is open on loopback (test_kserve_operations.py); everything else needs it.
    for method, path in (
        ("POST", f"/v2/models/{DIGITS}/infer"),
        ("GET", f"/v2/models/{DIGITS}"),
    ):
        r = httpx.request(method, server.inference_url + path, json=body, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"] == 'Bearer realm="pipeline"'
        assert "error" in r.json()


def test_oversized_content_length_is_refused_before_the_body(server: Server) -> None:
    host, port = server.inference_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            (
                f"POST /v2/models/{DIGITS}/infer HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {_key(server)}\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000000000\r\n\r\n"
            ).encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert "error" in json.loads(body)


def test_oversized_chunked_body_is_refused(server: Server) -> None:
    def chunks():
        for _ in range(6):
            yield b" " * 2**20

    r = httpx.post(
        f"{server.inference_url}/v2/models/{DIGITS}/infer",
        content=chunks(),
        headers={**_auth(server), "Content-Type": "application/json"},
    )
    assert r.status_code == 413 and "error" in r.json()


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"x": 1}',
        b'{"inputs": [{"name": "image", "shape": [1, 1, 28, 27], "datatype": "FP32", "data": ['
        + b",".join([b"0.5"] * 756)
        + b"]}]}",
        b'{"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP64", "data": ['
        + b",".join([b"0.5"] * 784)
        + b"]}]}",
        b'{"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [1, 2]}]}',
        b'{"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": ["a"]}]}',
        b'{"inputs": [{"name": "other", "shape": [1], "datatype": "FP32", "data": [1]}]}',
        b'{"inputs": [{"name": "image", "shape": [1, 10000000000], "datatype": "FP32", "data": [1]}]}',
        b'{"inputs": [{"name": "image", "shape": "x", "datatype": "FP32", "data": [1]}]}',
        b'{"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "NOPE", "data": [1]}]}',
    ],
    ids=[
        "malformed",
        "no-inputs",
        "shape",
        "dtype",
        "count",
        "strings",
        "name",
        "huge",
        "shape-type",
        "datatype",
    ],
)
def test_bad_input_is_400_json(server: Server, body: bytes) -> None:
    r = httpx.post(
        f"{server.inference_url}/v2/models/{DIGITS}/infer",
        content=body,
        headers={**_auth(server), "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert isinstance(r.json()["error"], str)


def _binary(header: dict, data: bytes) -> tuple[bytes, str]:
    raw = json.dumps(header).encode()
    return raw + data, str(len(raw))


_IMAGE = {"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32"}
_PIXELS = np.full(784, 0.5, np.float32).tobytes()


@pytest.mark.parametrize(
    ("body", "length"),
    [
        _binary({"inputs": [{**_IMAGE, "parameters": {"binary_data_size": 3136}}]}, _PIXELS[:-4]),
        _binary({"inputs": [{**_IMAGE, "parameters": {"binary_data_size": 3135}}]}, _PIXELS[:-1]),
        _binary({"inputs": [{**_IMAGE, "parameters": {"binary_data_size": "x"}}]}, _PIXELS),
        _binary({"inputs": [{**_IMAGE, "parameters": {"binary_data_size": 3136}}]}, _PIXELS + b"!"),
        (b"\x93NUMPY" + _PIXELS, "9999999"),
        (b"not json" + _PIXELS, "8"),
        (b'{"inputs": 1}', "abc"),
    ],
    ids=["short", "odd-size", "size-type", "trailing", "length", "header", "length-type"],
)
def test_bad_binary_body_is_400_json(server: Server, body: bytes, length: str) -> None:
    """The Open Inference Protocol's binary extension, malformed every way: 400 JSON."""
    r = httpx.post(
        f"{server.inference_url}/v2/models/{DIGITS}/infer",
        content=body,
        headers={
            **_auth(server),
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": length,
        },
    )
    assert r.status_code == 400, r.text
    assert isinstance(r.json()["error"], str)


def test_health_ready_after_warm_up_and_metrics(server: Server) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert httpx.get(server.inference_url + path).status_code == 200  # no token needed
    for path in ("/openapi.json", "/v1/models", f"/v2/repository/models/{DIGITS}/unload"):
        r = httpx.post(server.inference_url + path, headers=_auth(server))
        assert r.status_code == 404, path
    log = (Path(server.run_dir) / "logs" / "kserve.out").read_text()
    warmed = [log.index(f"{m} (") for m in (DIGITS, DIGITS_TS, GATE)]
    # The worker's line once its SO_REUSEPORT socket listens (uvicorn logs none for it).
    assert max(warmed) < log.index("HTTP listening on"), "the port opened before warm-up"
    r = httpx.get(f"{server.inference_url}/metrics", headers=_auth(server))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert f'pipeline_kserve_warmed_up{{model_name="{DIGITS}"}} 1.0' in r.text
    assert "# TYPE pipeline_kserve_batch_size histogram" in r.text


def test_status_says_each_model_is_ready(server: Server, tmp_path: Path) -> None:
    """`pipeline status` asks each served model's readiness (the protocol's own route,
    /v2/models/<name>/ready) and prints it; a model that is not is in test_ray_runtime.py."""
    proc = run_cli("status", "--run-dir", server.run_dir, "--store", tmp_path / "none")
    assert proc.returncode == 0, proc.stderr
    for model in (DIGITS, DIGITS_TS, GATE):
        assert re.search(rf"^  {model}: .*; ready$", proc.stdout, re.M), proc.stdout


def _concurrently(server: Server, model: str, bodies: list[dict]) -> list[httpx.Response]:
    answers: list[httpx.Response | None] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def one(i: int) -> None:
        barrier.wait()
        answers[i] = _infer(server, model, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers  # type: ignore[return-value]


def test_concurrent_requests_are_stacked(server: Server, exported: ExportResult) -> None:
    opened = open_export(exported.out_dir)
    count0, sum0 = _histogram(server, DIGITS)
    xs = [opened.sample(1 + i % 2, seed=i)["image"] for i in range(8)]
    answers = _concurrently(server, DIGITS, [_v2("image", x.numpy()) for x in xs])
    for x, r in zip(xs, answers, strict=True):
        assert r.status_code == 200, r.text
        _check(r.json(), opened.eager({"image": x})["logits"], opened.manifest)
    count, total = _histogram(server, DIGITS)
    assert total - sum0 == 8  # every request in exactly one forward pass
    assert count - count0 < 8, "no two requests shared a forward pass"


def test_stack_requests_false_never_mixes_clients(server: Server, gate: ExportResult) -> None:
    opened = open_export(gate.out_dir)
    assert opened.manifest.serving.stack_requests is False
    count0, sum0 = _histogram(server, GATE)
    # The gate returns x if x.sum() > 0 else -x, summed over the whole batch: mixing a
    # positive request with a negative one would flip one of them.
    xs = [torch.full((1, 4), 0.5 if i % 2 else -0.25) for i in range(8)]
    answers = _concurrently(server, GATE, [_v2("x", x.numpy()) for x in xs])
    for x, r in zip(xs, answers, strict=True):
        assert r.status_code == 200, r.text
        _check(r.json(), opened.eager({"x": x})["y"], opened.manifest)
    count, total = _histogram(server, GATE)
    assert count - count0 == 8 and total - sum0 == 8  # one request per forward pass


def test_https_rest_and_grpc(gate: ExportResult, tmp_path: Path) -> None:
    import ssl

    import grpc

    from tests.integration.test_reliability import _self_signed

    cert, key = _self_signed(tmp_path)
    run_dir = tmp_path / "run"
    config = RuntimeConfig(
        models=[served_export(gate.out_dir)],
        http_port=free_port(),
        grpc_port=free_port(),
        tls_cert=str(cert),
        tls_key=str(key),
    )
    try:
        server = start(config, run_dir)
        assert server.inference_url.startswith("https://127.0.0.1:")
        x = np.full((1, 4), 0.5, np.float32)
        ctx = ssl.create_default_context(cafile=str(cert))
        r = httpx.post(
            f"{server.inference_url}/v2/models/{GATE}/infer",
            json=_v2("x", x),
            headers=_auth(server),
            verify=ctx,
        )
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["outputs"][0]["data"], x.reshape(-1))
        with pytest.raises(httpx.HTTPError):  # plain HTTP gets no answer
            httpx.get(server.inference_url.replace("https", "http") + "/v2/health/live")
        pb, pbg = _stubs()
        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(server.extras["grpc_url"], creds) as channel:
            reply = pbg.GRPCInferenceServiceStub(channel).ModelReady(
                pb.ModelReadyRequest(name=GATE),
                metadata=[("authorization", f"Bearer {_key(server)}")],
                timeout=30,
            )
        assert reply.ready
    finally:
        stop(run_dir)
    assert not (run_dir / SERVER_FILE).exists()


def test_verify_checks_the_runtime_over_rest_and_grpc(
    server: Server, exported: ExportResult, tmp_path: Path
) -> None:
    """`pipeline verify --backend kserve` compares both transports of every model the
    runtime serves from this export with eager, like the in-process backends."""
    report = tmp_path / "parity.json"
    run_dir = Path(server.run_dir)
    proc = run_cli(
        "verify", "--model", "digits_lenet", "--export-dir", exported.out_dir,
        "--backend", "kserve", "--run-dir", run_dir, "--report", report,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(report.read_text())["rows"]
    rows = [r for r in rows if r["backend"].startswith("kserve/")]  # not the golden-file check
    backends = {r["backend"] for r in rows}
    assert backends == {
        f"kserve/{t}/{f}" for t in ("rest", "grpc") for f in ("onnx", "torchscript")
    }
    assert all(r["passed"] for r in rows)
    # No runtime in the folder: a clear error naming the command to run, not a traceback.
    missing = run_cli(
        "verify", "--model", "digits_lenet", "--export-dir", exported.out_dir,
        "--backend", "kserve", "--run-dir", tmp_path / "none",
    )  # fmt: skip
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "pipeline serve" in missing.stdout + missing.stderr


def test_a_case_over_the_servers_limit_is_noted_not_failed(
    server: Server, exported: ExportResult, tmp_path: Path
) -> None:
    """A batch the server refuses as too large (413: here 300 samples, over 32 × its batch
    size of 8; a user's trial: SSDlite's batch of 7 over the 4 MiB default) is the server's
    limit, not a wrong answer: noted with what to do, the other cases judged. It was a
    crashed check that failed verify at the server's defaults."""
    from pipeline.export.opened import open_export
    from pipeline.serving.backends import ServedBackend
    from pipeline.verify import VerifyConfig, verify

    opened = open_export(exported.out_dir)
    backend = ServedBackend(server, DIGITS, "onnx", opened.manifest, "rest")
    config = VerifyConfig(model=DIGITS, export_dir=exported.out_dir, backends=("kserve",),
                          report=tmp_path / "parity.json", page=False, batch_sizes=(2, 300))  # fmt: skip
    report = verify(config, served=[backend], exported=opened)
    assert report.passed, report.failure_message()
    said = [n for n in report.notes if "not sent, over the server's request size limit" in n]
    assert len(said) == 1 and "b=300" in said[0] and "--max-request-size" in said[0], said
    assert any(r.backend == backend.name and "b=2" in r.inputs for r in report.rows)


def test_one_command_reads_the_export_once(
    server: Server, exported: ExportResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify --backend kserve and loadtest --serve --runtime kserve (in-process) hand the
    opened export down the layers: one read of its manifest each, and none of the other
    exports the runtime serves (what it serves is in its record)."""
    from pipeline.cli import main

    export = exported.out_dir.resolve()
    with counted() as reads:
        code = main([
            "verify", "--model", DIGITS, "--export-dir", str(exported.out_dir),
            "--backend", "kserve", "--run-dir", server.run_dir,
            "--report", str(tmp_path / "parity.json"),
        ])  # fmt: skip
    said = capsys.readouterr()
    assert code == 0, said.out[-2000:] + said.err[-2000:]
    assert reads == {export: 1}, reads
    with counted() as reads:
        code = main([
            "loadtest", "--model", DIGITS, "--export-dir", str(exported.out_dir),
            "--serve", "--runtime", "kserve", "--format", "onnx",
            "--requests", "20", "--concurrency", "2",
        ])  # fmt: skip
    said = capsys.readouterr()
    assert code == 0 and "PASSED" in said.out, said.out[-2000:] + said.err[-2000:]
    assert reads == {export: 1}, reads


def test_infer_sends_request_files_in_the_open_inference_protocol(
    server: Server, exported: ExportResult, tmp_path: Path
) -> None:
    """`pipeline infer` against the runtime: .npy, the handlers' JSON and a torch.save'd .pt
    all go out as OIP requests (datatypes from the model's metadata) and answer like eager;
    an image, which the protocol cannot carry, is refused with advice, not a traceback."""
    opened = open_export(exported.out_dir)
    x = opened.sample(1, seed=3)["image"]
    expected = opened.eager({"image": x})["logits"]
    np.save(tmp_path / "digit.npy", x.numpy())
    (tmp_path / "digit.json").write_text(json.dumps({"inputs": x.double().tolist()}))
    torch.save({"image": x}, tmp_path / "digit.pt")
    run_dir = Path(server.run_dir)
    for name in ("digit.npy", "digit.json", "digit.pt"):
        proc = run_cli("infer", "--model", DIGITS, tmp_path / name, "--run-dir", run_dir)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        answer = json.loads(proc.stdout)
        assert answer["model_name"] == DIGITS  # a served name is taken as given
        _check(answer, expected, opened.manifest)
    (tmp_path / "digit.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)
    image = run_cli("infer", "--model", DIGITS, tmp_path / "digit.png", "--run-dir", run_dir)
    assert image.returncode != 0 and "Traceback" not in image.stderr
    assert "not images" in image.stdout + image.stderr


def test_loadtest_checks_every_answer_against_eager(
    server: Server, exported: ExportResult, tmp_path: Path
) -> None:
    """`pipeline loadtest` against the runtime: OIP JSON and binary bodies in turn, every
    answer compared with eager, memory read from the runtime's process."""
    report_path = tmp_path / "load.json"
    proc = run_cli(
        "loadtest", "--model", DIGITS, "--export-dir", exported.out_dir, "--format", "onnx",
        "--requests", "300", "--concurrency", "8", "--encodings", "json,npy",
        "--run-dir", server.run_dir, "--json", report_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (report,) = json.loads(report_path.read_text())["runs"]
    assert report["served"] == DIGITS  # the ONNX model, found by model and format
    assert report["passed"] and report["answered"] == 300 and report["wrong"] == 0
    # The one worker under the supervisor (server.pid); test_kserve_workers.py has two.
    assert report["worker_pids_before"] == [p.pid for p in psutil.Process(server.pid).children()]
    assert report["worker_rss_mb_before"] > 50
    # What only TorchServe has is refused up front, with the reason.
    for extra in (["--encodings", "json-form"],):
        refused = run_cli(
            "loadtest", "--model", DIGITS, "--export-dir", exported.out_dir,
            "--requests", "20", "--run-dir", server.run_dir, *extra,
        )  # fmt: skip
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert "KServe runtime" in refused.stdout + refused.stderr
