"""A real TorchServe serving the digits CNN and the RNN family, TorchScript and ONNX.

Two models are also served as AOTInductor `.pt2` (PT2_SERVED): the CNN, and
`my_cell`, whose two inputs share the batch axis (the compiled code does not
check that they agree). The other packages would only add workers on two cores;
verify runs every `.pt2` in-process. One module-scoped server on free loopback ports, always stopped; its logs are
printed at teardown (pytest shows them when something failed).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.core.manifest import read_manifest
from pipeline.export import ExportConfig, ExportResult, export
from pipeline.formats import base as registry
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive, archive_name
from pipeline.runtimes.torchserve.launch import (
    ServeConfig,
    ServeError,
    Server,
    free_port,
    start,
    stop,
)
from pipeline.runtimes.torchserve.management import management
from pipeline.serving.backends import served_backends
from pipeline.serving.client import numpy_body, post, resolve_model, tensors_body
from pipeline.train import TrainResult
from pipeline.verify import ParityReport, VerifyConfig, verify
from pipeline.zoo.data import digits_sample, preprocess_digits
from tests import otlp, ts_worker
from tests.tamper import copy_export

SERVED = ["digits_lenet", "my_decision_gate", "my_cell", "my_rnn_loop", "wrap_rnn"]
PT2_SERVED = ("digits_lenet", "my_cell")


def _ports() -> dict[str, int]:
    return {
        "inference_port": free_port(),
        "management_port": free_port(),
        "metrics_port": free_port(),
    }


@pytest.fixture(scope="module")
def exports(all_exports: dict[str, ExportResult]) -> dict[str, ExportResult]:
    return all_exports


@pytest.fixture(scope="module")
def store(exports: dict[str, ExportResult], tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("model_store")
    for name, result in exports.items():
        formats = tuple(
            f.key
            for f in registry.all_formats()
            if f.served
            and f.key in result.manifest.artifacts
            and (f.key != "pt2" or name in PT2_SERVED)
        )
        # A longer batch delay makes concurrent requests land in one batch.
        archive(
            ArchiveConfig(
                model=name,
                export_dir=result.out_dir,
                store=store,
                formats=formats,
                max_batch_delay_ms=50,
            )
        )
    return store


@pytest.fixture(scope="module")
def server(
    store: Path, tmp_path_factory: pytest.TempPathFactory, receiver: otlp.Receiver
) -> Iterator[Server]:
    """TorchServe behind the gateway, tracing to a real OTLP/HTTP receiver (issue 40)."""
    run_dir = tmp_path_factory.mktemp("serve_run")
    with receiver.exporting("torchserve-tests"):
        srv = start(ServeConfig(store=store, run_dir=run_dir, startup_timeout_s=420, **_ports()))
    try:
        yield srv
    finally:
        stop(run_dir)
        log = run_dir / "logs" / "model_log.log"
        if log.is_file():
            print(
                "---- model_log.log (tail) ----\n" + "\n".join(log.read_text().splitlines()[-60:])
            )


def _verify_served(
    model: str, export_dir: Path, run_dir: Path, report: Path, **tolerance: float
) -> ParityReport:
    """verify with the served backends of `model`, as `pipeline verify --backend torchserve`."""
    served = served_backends(model, read_manifest(export_dir), Server.load(run_dir))
    config = VerifyConfig(
        model=model, export_dir=export_dir, backends=("torchserve",), report=report, **tolerance
    )
    return verify(config, served=served)


def _pids(server: Server) -> dict[str, list[int]]:
    headers = {"Authorization": f"Bearer {server.keys()['management']}"}
    out = {}
    for name in server.models:
        body = httpx.get(
            f"{server.extras['management_url']}/models/{name}", headers=headers, timeout=10
        ).json()
        out[name] = sorted(w["pid"] for w in body[0]["workers"])
    return out


def test_secure_config(server: Server, store: Path) -> None:
    props = (Path(server.run_dir) / "config.properties").read_text()
    for line in (
        "inference_address=http://127.0.0.1:",
        "management_address=http://127.0.0.1:",
        "metrics_address=http://127.0.0.1:",
        "enable_model_api=false",
        "disable_token_authorization=false",
        "max_request_size=",
        "max_response_size=",
        "allowed_urls=file://",
    ):
        assert line in props
    assert f"allowed_urls=file://{store.resolve()}/.*\n" in props  # the local store only
    # Every socket TorchServe listens on (HTTP, metrics, gRPC) is on loopback.
    import psutil

    def sockets(proc: psutil.Process) -> list:
        # net_connections() is psutil 6's name; kserve pins psutil<6 (connections()).
        return getattr(proc, "net_connections", proc.connections)(kind="inet")

    procs = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    listening = [c.laddr.ip for p in procs for c in sockets(p) if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 5
    gateway = sockets(psutil.Process(server.pids["gateway"]))
    listening += [c.laddr.ip for c in gateway if c.status == psutil.CONN_LISTEN]
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in listening), listening
    assert server.inference_url != server.extras["backend_url"]  # clients go through the gateway


@pytest.mark.parametrize("name", SERVED)
def test_served_parity_every_format(
    server: Server, exports: dict[str, ExportResult], name: str, tmp_path: Path
) -> None:
    report = _verify_served(name, exports[name].out_dir, Path(server.run_dir), tmp_path / "p.json")
    assert report.passed, report.failure_message()
    assert {r.backend for r in report.rows} == {
        "golden file",
        "torchserve/torchscript",
        "torchserve/onnx",
        *(["torchserve/pt2"] if name in PT2_SERVED else []),
    }
    if name != "digits_lenet":
        labels = {r.inputs for r in report.rows}
        assert any("+" in label or ">0" in label for label in labels)
        assert any("-" in label or "<0" in label for label in labels)


def test_describe_answers_the_io_contract_and_serve_records_each_archive(server: Server) -> None:
    """TorchServe's describe request reaches the handler's describe_handle; server.json says
    which model and format each archive is, so clients never parse archive names."""
    resp = management(server, "GET", "/models/my_cell_pt2", params={"customized": "true"})
    assert resp.status_code == 200, resp.text
    contract = resp.json()[0]["customizedMetadata"]
    contract = json.loads(contract) if isinstance(contract, str) else contract
    assert (contract["model"], contract["format"]) == ("my_cell", "pt2")
    assert [i["name"] for i in contract["inputs"]] == ["x", "h"]
    assert contract["inputs"][0]["shape"] == ["batch", 4]
    assert contract["stack_requests"] is False
    recorded = Server.load(Path(server.run_dir)).served
    assert set(recorded) == set(server.models)
    assert (recorded["my_cell_pt2"].model, recorded["my_cell_pt2"].format) == ("my_cell", "pt2")
    assert resolve_model(server, "digits_lenet") == "digits_lenet_ts"  # the reference format


GATEWAY_SPANS = {"auth", "forward to TorchServe", "answer"}
HANDLER_SPANS = {"preprocess", "inference", "postprocess"}


def test_traces_run_from_the_gateway_into_the_handler(
    server: Server, receiver: otlp.Receiver
) -> None:
    """Issue 40: a prediction's trace continues the client's traceparent through the
    gateway (auth, forward to TorchServe, answer) into TorchServe's handler, which joins
    it from the header the gateway forwards (handle: preprocess, inference, postprocess);
    the answer's traceresponse and the gateway's access log name the trace."""
    name = archive_name("digits_lenet", "onnx")
    sent = []
    for n in range(3):
        trace_id, parent = f"{n + 0xABC:032x}", f"{n + 0xDEF:016x}"
        resp = post(server, name, tensors_body({"image": digits_sample(1)}),
                    headers={"traceparent": f"00-{trace_id}-{parent}-01"})  # fmt: skip
        assert resp.status_code == 200, resp.text
        assert resp.headers["traceresponse"].split("-")[1] == trace_id
        sent.append((trace_id, parent))
    for trace_id, parent in sent:
        spans = receiver.spans_of(trace_id, GATEWAY_SPANS | HANDLER_SPANS | {"handle"}, 90)
        (root,) = [s for s in spans if s.parent_id == parent]
        assert root.name == "POST /predictions/{model}" and root.service == "torchserve-tests"
        children = {s.name: s for s in spans if s.parent_id == root.span_id}
        assert set(children) == GATEWAY_SPANS, [s.name for s in spans]
        (handle,) = [s for s in spans if s.name == "handle"]
        assert handle.parent_id == children["forward to TorchServe"].span_id
        assert handle.attributes["model.name"] == name
        assert {s.name for s in spans if s.parent_id == handle.span_id} == HANDLER_SPANS
    log = (Path(server.run_dir) / "logs" / "gateway.log").read_text()
    assert all(f"traceresponse=00-{t}-" in log for t, _ in sent)


@pytest.mark.parametrize("fmt", ["torchscript", "pt2"])
def test_concurrent_requests_are_batched_and_answered_correctly(
    server: Server, exports: dict[str, ExportResult], fmt: str
) -> None:
    model = torch.jit.load(str(exports["digits_lenet"].out_dir / "model.torchscript.pt"))
    images = digits_sample(24)
    sizes = [1, 2, 3] * 4  # 12 requests, 24 images

    def call(i: int) -> tuple[int, list]:
        start = sum(sizes[:i])
        body = tensors_body({"image": images[start : start + sizes[i]]})
        resp = post(server, archive_name("digits_lenet", fmt), body)
        assert resp.status_code == 200, resp.text
        return i, resp.json()["outputs"]["logits"]

    barrier = threading.Barrier(len(sizes))

    def synced(i: int) -> tuple[int, list]:
        barrier.wait(timeout=30)
        return call(i)

    with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
        results = dict(pool.map(synced, range(len(sizes))))
    for i, logits in results.items():
        start = sum(sizes[:i])
        expected = model(images[start : start + sizes[i]])
        torch.testing.assert_close(torch.tensor(logits), expected, atol=1e-5, rtol=1e-4)
    log = (Path(server.run_dir) / "logs" / "model_log.log").read_text().splitlines()
    worker = f"-{archive_name('digits_lenet', fmt)}_1.0"  # this model's worker lines
    assert any(worker in line and "dynamic batching:" in line for line in log)


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "pt2"])
def test_image_request_matches_training_preprocessing(
    server: Server, exports: dict[str, ExportResult], fmt: str
) -> None:
    from pipeline.zoo.data import load_digits_arrays

    images, _ = load_digits_arrays()
    pixels = (images[5] * 255 / 16).round().astype(np.uint8)
    resp = post(server, archive_name("digits_lenet", fmt), _png(pixels), "image/png")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    model = torch.jit.load(str(exports["digits_lenet"].out_dir / "model.torchscript.pt"))
    expected = model(preprocess_digits(pixels[None].astype(np.float32), max_value=255.0))
    torch.testing.assert_close(
        torch.tensor(body["outputs"]["logits"]), expected, atol=1e-4, rtol=1e-4
    )
    assert body["topk"][0][0]["class"] == int(expected.argmax())
    assert len(body["topk"][0]) == 3


def test_named_inputs_and_open_inference_protocol(
    server: Server, exports: dict[str, ExportResult]
) -> None:
    x, h = torch.randn(2, 4), torch.tanh(torch.randn(2, 4))
    named = post(server, "my_cell_ts", tensors_body({"x": x, "h": h}))
    assert named.status_code == 200, named.text
    assert set(named.json()["outputs"]) == {"y", "h_next"}
    v2 = {
        "inputs": [
            {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.reshape(-1).tolist()},
            {"name": "h", "shape": [2, 4], "datatype": "FP32", "data": h.reshape(-1).tolist()},
        ]
    }
    resp = post(server, "my_cell_onnx", json.dumps(v2).encode())
    assert resp.status_code == 200, resp.text
    out = {o["name"]: o for o in resp.json()["outputs"]}
    assert out["y"]["shape"] == [2, 4]
    assert out["y"]["datatype"] == "FP32"
    torch.testing.assert_close(
        torch.tensor(out["y"]["data"]).reshape(2, 4), torch.tensor(named.json()["outputs"]["y"])
    )
    # One sample without its batch axis comes back without it too.
    single = post(
        server, "my_decision_gate_ts", json.dumps({"inputs": [-1.0, -2.0, 0.5, 0.1]}).encode()
    )
    assert single.json()["outputs"]["y"] == pytest.approx([1.0, 2.0, -0.5, -0.1])


def _image_bytes(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (28, 28), color=128).save(buf, fmt)
    return buf.getvalue()


def test_numpy_binary_bodies_match_json(server: Server) -> None:
    for name, inputs in (
        ("digits_lenet_onnx", {"image": digits_sample(3)}),
        ("my_cell_ts", {"x": torch.rand(2, 4), "h": torch.rand(2, 4)}),
    ):
        as_json = post(server, name, tensors_body(inputs))
        binary = post(server, name, numpy_body(inputs), "application/octet-stream")
        assert binary.status_code == 200, binary.text
        assert binary.json()["outputs"] == as_json.json()["outputs"]
    wrong = post(
        server,
        "digits_lenet_ts",
        numpy_body({"image": digits_sample(1).double()}),
        "application/octet-stream",
    )
    assert wrong.status_code == 400
    assert "float32" in wrong.json()["error"]


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()


def zeros_npz(name: str, shape: tuple[int, ...]) -> bytes:
    """An .npz holding zeros of `shape`, deflated as written: 10,000 digits fit in 30 KB."""
    import zipfile

    buf = io.BytesIO()
    with (
        zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf,
        zf.open(f"{name}.npy", "w", force_zip64=True) as fp,
    ):
        fp.write(npy_header(shape))
        left, chunk = math.prod(shape) * 4, bytes(1 << 20)
        while left > 0:
            fp.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
    return buf.getvalue()


def form(*parts: tuple[str | None, bytes], boundary: str = "x", head: str = "") -> bytes:
    """A multipart/form-data body; `head` adds part headers (all parts)."""
    out = b""
    for name, data in parts:
        named = f'; name="{name}"' if name else ""
        out += f"--{boundary}\r\nContent-Disposition: form-data{named}\r\n{head}\r\n".encode()
        out += data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


FORM = "application/x-www-form-urlencoded"  # what curl sends with --data-binary by default
MULTIPART = "multipart/form-data; boundary=x"
# A valid 69-byte PNG that claims to be 30000×30000 pixels.
BOMB_PNG = (
    "89504e470d0a1a0a0000000d4948445200007530000075300800000000434ca7660000000c"
    "49444154789c6360a03d00000064000186643c350000000049454e44ae426082"
)
BAD_REQUESTS = [
    ("malformed json", b'{"inputs": [[1, 2', "application/json", 400, "Malformed JSON"),
    ("missing inputs field", b'{"instances": []}', "application/json", 400, "'inputs' field"),
    ("wrong shape", b'{"inputs": [[1, 2, 3]]}', "application/json", 400, "must have shape"),
    ("wrong dtype", b'{"inputs": [[["a"]]]}', "application/json", 400, "float32"),
    ("v2 wrong datatype", json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "INT64", "data": [0] * 784}]}).encode(), "application/json", 400, "datatype must be FP32"),
    ("not an image", b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 20, "image/png", 400, "cannot be decoded"),
    ("random bytes", bytes(range(256)) * 4, "application/octet-stream", 415, ""),
    ("empty body", b"", "application/json", 400, "Empty request body"),
    ("NaN values", json.dumps({"inputs": [[[float("nan")] * 28] * 28]}).encode(), "application/json", 400, "NaN"),
    ("Inf values", json.dumps({"inputs": [[[float("inf")] * 28] * 28]}).encode(), "application/json", 400, "Inf"),
    ("wrong input name", b'{"inputs": {"x": [1.0]}}', "application/json", 400, "must be named"),
    ("strings as numbers", json.dumps({"inputs": [[["0.5"] * 28] * 28]}).encode(), "application/json", 400, "float32"),
    ("image bomb", bytes.fromhex(BOMB_PNG), "image/png", 413, "4096"),
    ("deeply nested json", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json", 400, "nested too deeply"),
    ("top-level array", b"[1, 2, 3]", "application/json", 400, "object with an 'inputs' field"),
    ("inputs null", b'{"inputs": null}', "application/json", 400, "list of numbers"),
    ("inputs a string", b'{"inputs": "abc"}', "application/json", 400, "list of numbers"),
    ("inputs a scalar", b'{"inputs": 3}', "application/json", 400, "must have shape"),
    ("empty batch", b'{"inputs": []}', "application/json", 400, "must have shape"),
    ("overflowing float32", json.dumps({"inputs": [[[1e39] * 28] * 28]}).encode(), "application/json", 400, "NaN or Inf"),
    ("v2 huge shape", json.dumps({"inputs": [{"name": "image", "shape": [10**12, 1, 28, 28], "datatype": "FP32", "data": [0.0]}]}).encode(), "application/json", 400, "too large"),
    ("v2 negative shape", json.dumps({"inputs": [{"name": "image", "shape": [-1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}]}).encode(), "application/json", 400, "negative"),
    ("v2 data length mismatch", json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 10}]}).encode(), "application/json", 400, "784 values"),
    ("v2 missing data", json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32"}]}).encode(), "application/json", 400, "'data'"),
    ("unicode input name", json.dumps({"inputs": {"imag\u00e9\u202e": [0.0]}}).encode(), "application/json", 400, "must be named"),
    ("duplicate keys", b'{"inputs": [1.0], "inputs": {"x": 1}}', "application/json", 400, "must be named"),
    ("truncated png", _image_bytes("PNG")[:40], "image/png", 400, "cannot be decoded"),
    ("truncated jpeg", _image_bytes("JPEG")[:100], "image/jpeg", 400, "cannot be decoded"),
    ("gif image", _image_bytes("GIF"), "image/gif", 415, "PNG/JPEG"),
    ("plain text", b"hello", "text/plain", 415, "not JSON"),
    ("multipart form", b'--x\r\nContent-Disposition: form-data; name="data"\r\n\r\nabc\r\n--x--\r\n', "multipart/form-data; boundary=x", 415, "not JSON"),
    ("invalid utf-8", b'{"inputs": "\xff\xfe"}', "application/json", 415, "UTF-8"),
    # Content types TorchServe's own form decoder failed on (500) or misread ("Empty request
    # body"); the gateway now forwards what the body is (pipeline/runtimes/torchserve/bodies.py).
    ("curl's default type, bad %-escapes", b"a=%zz&b=%", FORM, 415, "not JSON"),
    ("curl's default type, JSON without inputs", b'{"instances": []}', FORM, 400, "'inputs' field"),
    ("form type with a charset, wrong shape", b'{"inputs": [[1, 2, 3]]}', FORM + "; charset=utf-16", 400, "must have shape"),
    ("no content type, random bytes", bytes(range(256)) * 4, "", 415, "UTF-8"),
    ("json with an unknown charset", b'{"inputs": [[1, 2, 3]]}', "application/json; charset=nonexistent", 400, "must have shape"),
    ("multipart, base64 junk part", form(("data", b"!!!!"), head="Content-Transfer-Encoding: base64\r\n"), MULTIPART, 400, "Empty request body"),
    ("multipart, unknown charset", form(("data", b"abc"), head="Content-Type: text/plain; charset=nonexistent\r\n"), MULTIPART, 415, "not JSON"),
    ("multipart, a part without a name", form((None, b"abc")), MULTIPART, 415, "not JSON"),
    ("multipart, no part named data", form(("a", b"1"), ("b", b"2")), MULTIPART, 400, "one part named 'data'"),
    ("multipart, empty boundary", form(("data", b"abc")), "multipart/form-data; boundary=", 415, "not JSON"),
    # Bounded work per request: checked from the .npy headers, before anything is read.
    ("10,000 samples in a 30 KB npz", zeros_npz("image", (10_000, 1, 28, 28)), "application/octet-stream", 413, "at most 256 per request"),
    ("npy declaring 10**12 values", npy_header((10**12, 1, 28, 28)), "application/octet-stream", 413, "the limit is"),
    ("npy header claiming more data than sent", npy_header((2, 1, 28, 28)) + bytes(100), "application/octet-stream", 400, "not a readable .npy"),
    ("object-dtype npy (a pickle)", npy_header((1,), "|O") + b"\x80\x04K\x01.", "application/octet-stream", 400, "pickle"),
]  # fmt: skip


@pytest.mark.parametrize("fmt", ["torchscript", "pt2"])
def test_bad_requests_get_4xx_json_and_the_worker_survives(server: Server, fmt: str) -> None:
    """For pt2 this matters most: the compiled code reads a wrong-shaped input out of bounds."""
    assert len({label for label, *_ in BAD_REQUESTS}) >= 30  # the catalogue, plus the oversize body
    before = _pids(server)
    name = archive_name("digits_lenet", fmt)
    for label, body, content_type, status, fragment in BAD_REQUESTS:
        resp = post(server, name, body, content_type)
        assert resp.status_code == status, (label, resp.status_code, resp.text)
        message = resp.json()
        assert message.get("error") or message.get("message"), label
        assert fragment in json.dumps(message), (label, message)
    # Over max_request_size: the gateway refuses it without reading it all.
    big = b'{"inputs": [' + b"0.0," * (2 * 1024 * 1024) + b"0.0]}"
    resp = post(server, name, big)
    assert resp.status_code == 413, resp.text
    assert "max_request_size" in resp.json()["message"]
    good = post(server, name, tensors_body({"image": digits_sample(1)}))
    assert good.status_code == 200
    assert _pids(server) == before  # no worker died


@pytest.mark.parametrize("archive", ["my_cell_ts", "my_cell_pt2"])
def test_inputs_disagreeing_on_a_shared_axis_get_a_400(
    server: Server, exports: dict[str, ExportResult], archive: str
) -> None:
    """Unchecked, AOTInductor's code reads h out of bounds (x of batch 2,000,000 and h of 1
    segfaulted) and TorchScript broadcasts h or fails with a 500."""
    before = _pids(server)
    for x, h in ((torch.rand(3, 4), torch.rand(2, 4)), (torch.rand(5000, 4), torch.rand(1, 4))):
        resp = post(server, archive, numpy_body({"x": x, "h": h}), "application/octet-stream")
        assert resp.status_code == 400, resp.text
        assert "share the axis 'batch'" in resp.json()["error"]
    x, h = torch.rand(2, 4), torch.rand(2, 4)
    good = post(server, archive, tensors_body({"x": x, "h": h}))
    assert good.status_code == 200, good.text
    model = torch.jit.load(str(exports["my_cell"].out_dir / "model.torchscript.pt"))
    torch.testing.assert_close(
        torch.tensor(good.json()["outputs"]["y"]), model(x, h)[0], atol=1e-5, rtol=1e-4
    )
    assert _pids(server) == before  # no worker died


def test_batch_coupled_models_are_not_stacked_across_clients(
    server: Server, exports: dict[str, ExportResult]
) -> None:
    """The gate sums over its batch: stacking two clients' requests could flip one's branch."""
    model = torch.jit.load(str(exports["my_decision_gate"].out_dir / "model.torchscript.pt"))
    bodies = [torch.full((1, 4), 0.5), torch.full((3, 4), -1.0)] * 4  # stacked, the sum is negative

    barrier = threading.Barrier(len(bodies))

    def call(x: torch.Tensor) -> list:
        barrier.wait(timeout=30)
        resp = post(server, "my_decision_gate_ts", tensors_body({"x": x}))
        assert resp.status_code == 200, resp.text
        return resp.json()["outputs"]["y"]

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        answers = list(pool.map(call, bodies))
    for x, y in zip(bodies, answers, strict=True):
        torch.testing.assert_close(torch.tensor(y), model(x))  # each answered as if alone


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_a_bad_request_fails_alone_in_its_batch(
    server: Server, exports: dict[str, ExportResult], fmt: str
) -> None:
    model = torch.jit.load(str(exports["digits_lenet"].out_dir / "model.torchscript.pt"))
    name = archive_name("digits_lenet", fmt)
    bodies = [tensors_body({"image": digits_sample(1, offset=i)}) for i in range(7)]
    bodies.insert(3, b'{"inputs": [[1.0]]}')
    barrier = threading.Barrier(len(bodies))

    def call(body: bytes) -> httpx.Response:
        barrier.wait(timeout=30)
        return post(server, name, body)

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        answers = list(pool.map(call, bodies))
    assert [a.status_code for a in answers] == [200, 200, 200, 400, 200, 200, 200, 200]
    good = [a for a in answers if a.status_code == 200]
    expected = model(digits_sample(7))
    for i, answer in enumerate(good):  # the neighbours got their own, correct answers
        torch.testing.assert_close(
            torch.tensor(answer.json()["outputs"]["logits"][0]), expected[i], atol=1e-4, rtol=1e-4
        )


def test_token_is_enforced(server: Server) -> None:
    body = tensors_body({"image": digits_sample(1)})
    name = archive_name("digits_lenet", "torchscript")
    key = server.keys()["inference"]
    url = f"{server.inference_url}/predictions/{name}"
    for header in (None, "Bearer", "Bearer wrong-token", f"Basic {key}", key, f"Bearer {key}x"):
        headers = {"Authorization": header} if header is not None else {}
        resp = httpx.post(url, content=body, headers=headers, timeout=10)
        assert resp.status_code == 401, (header, resp.text)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert "inference token" in resp.json()["message"]
    # TorchServe itself, behind the gateway, still wants its token too.
    direct = httpx.post(
        f"{server.extras['backend_url']}/predictions/{name}", content=body, timeout=10
    )
    assert direct.status_code in (400, 401)
    assert post(server, name, body).status_code == 200
    # The token never reaches a log, the gateway's access log included.
    logs = Path(server.run_dir) / "logs"
    assert (logs / "gateway.log").is_file()
    assert not any(key in p.read_text(errors="replace") for p in logs.glob("*.log"))


def test_gateway_routes(server: Server) -> None:
    """Only inference routes pass the gateway; health needs no secret."""
    ping = httpx.get(f"{server.inference_url}/ping", timeout=10)
    assert ping.status_code == 200
    assert ping.json()["status"] == "Healthy"
    headers = {"Authorization": f"Bearer {server.keys()['inference']}"}
    for method, path in (
        ("GET", "/models"),
        ("POST", "/models?url=digits_lenet_ts.mar"),
        ("GET", "/api-description"),
        ("GET", "/predictions/digits_lenet_ts"),
        ("DELETE", "/predictions/digits_lenet_ts"),
    ):
        resp = httpx.request(method, f"{server.inference_url}{path}", headers=headers, timeout=10)
        assert resp.status_code in (404, 405), (method, path, resp.status_code)
        assert resp.json()["code"] == resp.status_code
    missing = post(server, "no_such_model", b'{"inputs": [1.0]}')
    assert missing.status_code == 404
    assert "no_such_model" in missing.json()["message"]


def test_management_api_refuses_registration(server: Server) -> None:
    headers = {"Authorization": f"Bearer {server.keys()['management']}"}
    resp = httpx.post(
        f"{server.extras['management_url']}/models?url=digits_lenet_ts.mar",
        headers=headers,
        timeout=10,
    )
    assert resp.status_code == 405
    resp = httpx.delete(
        f"{server.extras['management_url']}/models/digits_lenet_ts", headers=headers, timeout=10
    )
    assert resp.status_code == 405
    assert httpx.get(f"{server.extras['management_url']}/models", timeout=10).status_code in (
        400,
        401,
    )


def _tampered_onnx_archive(exports: dict[str, ExportResult], tmp_path: Path) -> Path:
    """my_decision_gate's ONNX archive, built by archive(), with a different model.onnx
    swapped in afterwards (the manifest and its sha256 kept)."""
    import zipfile

    export_dir = copy_export(exports["my_decision_gate"], tmp_path / "export")
    (mar,) = archive(
        ArchiveConfig(
            model="my_decision_gate",
            export_dir=export_dir,
            store=tmp_path / "store",
            formats=("onnx",),
        )
    )
    tampered = tmp_path / "tampered.mar"
    with zipfile.ZipFile(mar) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "model.onnx":
                data = data.replace(b"pipeline", b"pipelinX") + b"\x00"
            dst.writestr(item, data)
    tampered.replace(mar)
    return mar


def test_tampered_artifact_is_refused_by_torchserves_loader(
    exports: dict[str, ExportResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive unpacked and loaded by TorchServe's own TsModelLoader, in-process, as
    the worker loads it (tests/ts_worker.py): the shipped handler refuses it."""
    mar = _tampered_onnx_archive(exports, tmp_path)
    with pytest.raises(RuntimeError, match=r"Refusing to serve model\.onnx") as refused:
        ts_worker.load(mar, tmp_path / "tmp", monkeypatch)
    assert type(refused.value).__name__ == "IntegrityError"
    assert "sha256" in str(refused.value)


def test_tampered_artifact_is_refused_at_load(
    exports: dict[str, ExportResult], tmp_path: Path
) -> None:
    """The one real TorchServe start here that a refusal ends (every other refusal is
    checked through the loader, without Java): start fails naming the worker's reason,
    and the server is stopped."""
    store = _tampered_onnx_archive(exports, tmp_path).parent
    run_dir = tmp_path / "run"
    with pytest.raises(ServeError, match=r"Refusing to serve model\.onnx"):
        start(ServeConfig(store=store, run_dir=run_dir, startup_timeout_s=120, **_ports()))
    assert not (run_dir / "server.json").exists()  # and the server was stopped


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_pt2_without_cuda_is_refused_at_load(
    exports: dict[str, ExportResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded by TorchServe's own TsModelLoader, as the worker loads it (tests/ts_worker.py).
    That a refusal fails the start and stops the server is checked with a real TorchServe
    once, in test_tampered_artifact_is_refused_at_load."""
    export_dir = copy_export(exports["digits_lenet"], tmp_path / "export")
    manifest = read_manifest(export_dir)
    pt2 = manifest.artifact("pt2")
    # As `--pt2-device cuda` records it.
    cuda = dataclasses.replace(pt2, details={**pt2.details, "device": "cuda"})
    cuda_manifest = dataclasses.replace(manifest, artifacts={**manifest.artifacts, "pt2": cuda})
    (export_dir / "manifest.json").write_text(cuda_manifest.dumps())
    (mar,) = archive(
        ArchiveConfig(
            model="digits_lenet", export_dir=export_dir, store=tmp_path / "store", formats=("pt2",)
        )
    )
    with pytest.raises(RuntimeError, match=r"re-export with --pt2-device cpu") as refused:
        ts_worker.load(mar, tmp_path / "tmp", monkeypatch)
    assert type(refused.value).__name__ == "LoadError"


@pytest.mark.gpu
def test_gpu_serving_parity(exports: dict[str, ExportResult], tmp_path: Path) -> None:
    store = tmp_path / "store"
    archive(
        ArchiveConfig(
            model="digits_lenet",
            export_dir=exports["digits_lenet"].out_dir,
            store=store,
            device="gpu",
        )
    )
    run_dir = tmp_path / "run"
    srv = start(
        ServeConfig(
            store=store,
            run_dir=run_dir,
            models=["digits_lenet_ts", "digits_lenet_onnx"],
            gpu=True,
            **_ports(),
        )
    )
    try:
        headers = {"Authorization": f"Bearer {srv.keys()['management']}"}
        body = httpx.get(
            f"{srv.extras['management_url']}/models/digits_lenet_ts", headers=headers, timeout=10
        ).json()
        assert body[0]["workers"][0]["gpu"] is True
        report = _verify_served(
            "digits_lenet", exports["digits_lenet"].out_dir, run_dir, tmp_path / "p.json",
            atol=1e-4, rtol=1e-3,
        )  # fmt: skip
        assert report.passed, report.failure_message()
    finally:
        stop(run_dir)


@pytest.mark.gpu
def test_gpu_serving_pt2(
    trained: TrainResult, exports: dict[str, ExportResult], tmp_path: Path
) -> None:
    """A CUDA package runs on the worker's GPU; a CPU package on a GPU worker runs on CPU."""
    cuda = export(
        ExportConfig(
            checkpoint=trained.checkpoint.path,
            out_dir=tmp_path / "cuda_export",
            formats=("pt2",),
            pt2_device="cuda",
        )
    )
    for compiled_for, export_dir in (
        ("cuda", cuda.out_dir),
        ("cpu", exports["digits_lenet"].out_dir),
    ):
        store, run_dir = tmp_path / compiled_for / "store", tmp_path / compiled_for / "run"
        archive(
            ArchiveConfig(
                model="digits_lenet",
                export_dir=export_dir,
                store=store,
                formats=("pt2",),
                device="gpu",
            )
        )
        srv = start(ServeConfig(store=store, run_dir=run_dir, gpu=True, **_ports()))
        try:
            headers = {"Authorization": f"Bearer {srv.keys()['management']}"}
            body = httpx.get(
                f"{srv.extras['management_url']}/models/digits_lenet_pt2",
                headers=headers,
                timeout=10,
            ).json()
            assert body[0]["workers"][0]["gpu"] is True
            report = _verify_served(
                "digits_lenet", export_dir, run_dir, tmp_path / compiled_for / "p.json",
                atol=1e-4, rtol=1e-3,
            )  # fmt: skip
            assert report.passed, report.failure_message()
            assert "torchserve/pt2" in {r.backend for r in report.rows}
            log = (run_dir / "logs" / "model_log.log").read_text()
            assert ("was compiled for CPU: serving it on CPU" in log) == (compiled_for == "cpu")
        finally:
            stop(run_dir)
