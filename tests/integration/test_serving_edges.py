"""Bodies, content types and sizes at the edge, through a real gateway and TorchServe.

TorchServe 0.12's Java frontend decodes `application/x-www-form-urlencoded`
(what curl sends with `--data-binary` unless told otherwise) itself: the
README's own curl line got a 500 for most digit PNGs. The gateway now
forwards what a body is; this module sends the README's line as written and
every body under every content type, fuzzes the pair, checks that an .npz
bomb does not grow the worker, and runs a short load test in every encoding.

One module-scoped server: the digits CNN as TorchScript only (the quickest to
start), with `PIPELINE_MAX_SAMPLES` set so the environment's limit is the one
tested here (test_serving.py's server tests the default, 32 × batch size).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from pipeline.export import ExportResult
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.runtimes.torchserve.launch import Server, private_config, start, stop
from pipeline.runtimes.torchserve.management import management
from pipeline.serving.client import numpy_body, post, tensors_body
from pipeline.serving.loadtest import ENCODINGS, LoadConfig
from pipeline.serving.loadtest import run as load_run
from pipeline.zoo.data import preprocess_digits
from pipeline_runtime.request import MAX_SAMPLES_ENV
from tests.integration.test_serving import FORM, MULTIPART, form, zeros_npz

MODEL = "digits_lenet_ts"
MAX_SAMPLES = 100  # PIPELINE_MAX_SAMPLES for this module's server


@pytest.fixture(scope="module")
def edge_server(
    exported: ExportResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("edges")
    archive(
        ArchiveConfig(
            model="digits_lenet", export_dir=exported.out_dir, store=root / "store",
            formats=("torchscript",),
        )
    )  # fmt: skip
    # Workers inherit TorchServe's environment, fixed when it starts: restore ours at once.
    before = os.environ.get(MAX_SAMPLES_ENV)
    os.environ[MAX_SAMPLES_ENV] = str(MAX_SAMPLES)
    try:
        srv = start(private_config(root / "store", root / "run", workers_per_model=1))
    finally:
        if before is None:
            os.environ.pop(MAX_SAMPLES_ENV, None)
        else:
            os.environ[MAX_SAMPLES_ENV] = before
    try:
        yield srv
    finally:
        stop(root / "run")


@pytest.fixture(scope="module")
def model(exported: ExportResult) -> torch.jit.ScriptModule:
    return torch.jit.load(str(exported.out_dir / "model.torchscript.pt"))


def _worker(server: Server) -> psutil.Process:
    resp = management(server, "GET", f"/models/{MODEL}")
    (worker,) = resp.json()[0]["workers"]
    return psutil.Process(worker["pid"])


# A '%' not followed by two hex digits: TorchServe's form decoder throws on it (a 500).
BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


@pytest.fixture(scope="module")
def digit_png(edge_server: Server) -> tuple[bytes, np.ndarray]:
    """A 28×28 digit saved as a user saves it, which TorchServe alone answers with a 500 when
    sent as the README sends it (curl's default type): what the gateway has to fix."""
    from pipeline.zoo.data import load_digits_arrays

    key = edge_server.keys()["inference"]
    for image in load_digits_arrays()[0][:20]:
        pixels = np.asarray(
            Image.fromarray((image * 255 / 16).round().astype(np.uint8)).resize((28, 28))
        )
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        if not BAD_ESCAPE.search(buf.getvalue()):
            continue
        direct = httpx.post(
            f"{edge_server.extras['backend_url']}/predictions/{MODEL}",
            content=buf.getvalue(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": FORM},
            timeout=30,
        )
        if direct.status_code == 500 and "ErrorDataDecoderException" in direct.text:
            return buf.getvalue(), pixels
    raise AssertionError("TorchServe decoded every digit PNG sent as a form: is it still 0.12?")


def _expected(model: torch.jit.ScriptModule, pixels: np.ndarray) -> torch.Tensor:
    return model(preprocess_digits(pixels[None].astype(np.float32), max_value=255.0))


def test_the_readme_curl_line_and_every_content_type_get_the_right_answer(
    edge_server: Server, model: torch.jit.ScriptModule, digit_png: tuple, tmp_path: Path
) -> None:
    png, pixels = digit_png
    expected = _expected(model, pixels)
    x = preprocess_digits(pixels[None].astype(np.float32), max_value=255.0)
    (tmp_path / "digit.png").write_bytes(png)
    (tmp_path / "digit.json").write_bytes(tensors_body({"image": x}))
    (tmp_path / "digit.npy").write_bytes(numpy_body({"image": x}))
    key = edge_server.keys()["inference"]
    url = f"{edge_server.inference_url}/predictions/{MODEL}"
    cases = [  # (file, extra curl arguments); none: curl's default type
        ("digit.png", []),  # the README's line, as written
        ("digit.png", ["-H", "Content-Type:"]),  # curl sends no Content-Type at all
        ("digit.png", ["-H", "Content-Type: image/png"]),
        ("digit.png", ["-H", f"Content-Type: {FORM}"]),
        ("digit.json", ["-H", "Content-Type: application/json"]),
        ("digit.json", []),
        ("digit.json", ["-H", "Content-Type:"]),
        ("digit.npy", []),
        ("digit.npy", ["-H", "Content-Type: application/octet-stream"]),
    ]
    curl = shutil.which("curl")
    for name, extra in cases:
        if curl:  # exactly what a user types
            args = [curl, "-s", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {key}"]
            done = subprocess.run(
                [*args, *extra, "--data-binary", f"@{name}", url],
                cwd=tmp_path, capture_output=True, timeout=60, check=True,
            )  # fmt: skip
            text, _, status = done.stdout.decode().rpartition("\n")
        else:  # the same headers through httpx (which adds no Content-Type of its own)
            headers = {"Authorization": f"Bearer {key}"}
            if len(extra) == 2 and extra[1].split(":", 1)[1].strip():
                headers["Content-Type"] = extra[1].split(":", 1)[1].strip()
            elif not extra:
                headers["Content-Type"] = FORM  # curl's default
            resp = httpx.post(url, content=(tmp_path / name).read_bytes(), headers=headers)
            text, status = resp.text, str(resp.status_code)
        assert status == "200", (name, extra, status, text)
        answer = json.loads(text)
        torch.testing.assert_close(
            torch.tensor(answer["outputs"]["logits"]), expected, atol=1e-4, rtol=1e-4
        )
        assert answer["topk"][0][0]["class"] == int(expected.argmax()), (name, extra)
    # The form upload TorchServe's own examples use (curl -F data=@file) works too.
    files = {"data": ("digit.png", png, "image/png")}
    resp = httpx.post(url, files=files, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    torch.testing.assert_close(
        torch.tensor(resp.json()["outputs"]["logits"]), expected, atol=1e-4, rtol=1e-4
    )


CONTENT_TYPES = [
    None, "", FORM, f"{FORM}; charset=utf-16", "application/json", "application/json; charset=x",
    "image/png", "image/jpeg", "image/gif", "application/octet-stream", "text/plain",
    "multipart/form-data", MULTIPART, "multipart/form-data; boundary=", ";;;", "x/y; a=\"b",
]  # fmt: skip


def _post(server: Server, body: bytes, content_type: str | None) -> httpx.Response:
    headers: dict[str, str | bytes] = {"Authorization": f"Bearer {server.keys()['inference']}"}
    if content_type is not None:  # bytes: any UTF-8 a client may put in a header
        headers["Content-Type"] = content_type.encode("utf-8")
    return httpx.post(
        f"{server.inference_url}/predictions/{MODEL}", content=body, headers=headers, timeout=60
    )


def test_every_body_under_every_content_type_gets_a_4xx_or_the_answer(
    edge_server: Server, model: torch.jit.ScriptModule, digit_png: tuple
) -> None:
    png, pixels = digit_png
    jpeg = io.BytesIO()
    Image.fromarray(pixels).save(jpeg, format="JPEG")
    x = preprocess_digits(pixels[None].astype(np.float32), max_value=255.0)
    good = {
        "png": png,
        "json": tensors_body({"image": x}),
        "npy": numpy_body({"image": x}),
        "npz": zeros_npz("image", (1, 1, 28, 28)),
    }
    bad = {
        "jpeg, truncated": jpeg.getvalue()[:60],
        "form fields": b"a=%zz&b=%41&c",
        "garbage": bytes(range(256)) * 2,
        "empty": b"",
        "a form without a file": form(("a", png), ("b", b"1")),
    }
    pid = _worker(edge_server).pid
    for content_type in CONTENT_TYPES:
        for label, body in {**good, **bad}.items():
            resp = _post(edge_server, body, content_type)
            assert resp.status_code < 500, (label, content_type, resp.status_code, resp.text)
            answer = resp.json()
            if label in good:
                assert resp.status_code == 200, (label, content_type, resp.text)
                assert len(answer["outputs"]["logits"]) == 1
            else:
                assert 400 <= resp.status_code < 500, (label, content_type, resp.text)
                assert answer.get("error") or answer.get("message"), (label, content_type)
    assert _worker(edge_server).pid == pid  # no worker died


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    prefix = draw(st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"\x93NUMPY",
                                   b"PK\x03\x04", b"{", b"[", b"--x\r\n", b"a=%"]))  # fmt: skip
    return prefix + draw(st.binary(max_size=300))


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.one_of(st.sampled_from(CONTENT_TYPES), st.text(max_size=40)), bodies())
def test_fuzzed_content_types_and_bodies_never_get_a_5xx(
    edge_server: Server, content_type: str | None, body: bytes
) -> None:
    try:
        resp = _post(edge_server, body, content_type)
    except httpx.LocalProtocolError:
        return  # a header value httpx itself will not send (control characters)
    assert resp.status_code < 500, (content_type, body[:40], resp.text)
    if resp.headers.get("Content-Type", "").startswith("application/json"):
        assert resp.json()
    else:  # aiohttp's HTTP parser refuses control characters in a header, before the app
        assert resp.status_code == 400 and "Invalid header value" in resp.text, resp.text


def test_an_npz_bomb_does_not_grow_the_worker_and_big_batches_are_refused(
    edge_server: Server,
) -> None:
    worker = _worker(edge_server)
    for _ in range(3):  # settle: the first requests after start allocate a little
        assert post(edge_server, MODEL, zeros_npz("image", (8, 1, 28, 28)), "").status_code == 200
    before = worker.memory_info().rss
    # The bomb: 305 KB on the wire, 78,400,000 float32 values (314 MB) declared.
    bomb = zeros_npz("image", (100_000, 1, 28, 28))
    assert len(bomb) < 400_000
    resp = post(edge_server, MODEL, bomb, "application/octet-stream")
    assert resp.status_code == 413, resp.text
    assert "78400000 values" in resp.json()["error"]
    ten_thousand = zeros_npz("image", (10_000, 1, 28, 28))
    assert len(ten_thousand) < 40_000
    for content_type in ("application/octet-stream", "", FORM):
        resp = post(edge_server, MODEL, ten_thousand, content_type)
        assert resp.status_code == 413, resp.text
        assert (
            f"holds 10000 samples; this model takes at most {MAX_SAMPLES}" in resp.json()["error"]
        )
    grown = (worker.memory_info().rss - before) / 2**20
    assert grown < 50, f"the worker's RSS grew by {grown:.0f} MiB"
    assert _worker(edge_server).pid == worker.pid
    # The limit is PIPELINE_MAX_SAMPLES: 100 pass, 101 do not; the contract says so.
    at_limit = post(edge_server, MODEL, zeros_npz("image", (MAX_SAMPLES, 1, 28, 28)), "")
    assert at_limit.status_code == 200 and len(at_limit.json()["outputs"]["logits"]) == MAX_SAMPLES
    over = post(edge_server, MODEL, zeros_npz("image", (MAX_SAMPLES + 1, 1, 28, 28)), "")
    assert over.status_code == 413
    described = management(edge_server, "GET", f"/models/{MODEL}", params={"customized": "true"})
    contract = described.json()[0]["customizedMetadata"]
    contract = json.loads(contract) if isinstance(contract, str) else contract
    assert contract["max_samples"] == MAX_SAMPLES


def test_a_load_run_in_every_encoding_gets_no_5xx(
    edge_server: Server, exported: ExportResult
) -> None:
    report = load_run(
        LoadConfig(
            export_dir=exported.out_dir, served=MODEL, run_dir=Path(edge_server.run_dir),
            requests=360, concurrency=8, pool=12, encodings=tuple(ENCODINGS),
        )
    )  # fmt: skip
    assert report.passed, report.summary()
    assert report.server_errors == 0 and report.answered == 360


def test_the_gateway_inflates_gzip_and_deflate_and_refuses_what_does_not_decode(
    edge_server: Server, model: torch.jit.ScriptModule, digit_png: tuple
) -> None:
    import gzip
    import zlib

    _, pixels = digit_png
    x = preprocess_digits(pixels[None].astype(np.float32), max_value=255.0)
    body = tensors_body({"image": x})
    url = f"{edge_server.inference_url}/predictions/{MODEL}"
    key = {"Authorization": f"Bearer {edge_server.keys()['inference']}"}

    def send(content: bytes, encoding: str) -> httpx.Response:
        headers = {**key, "Content-Type": "application/json", "Content-Encoding": encoding}
        return httpx.post(url, content=content, headers=headers, timeout=60)

    expected = model(x)
    for content, encoding in ((gzip.compress(body), "gzip"), (zlib.compress(body), "deflate")):
        r = send(content, encoding)
        assert r.status_code == 200, r.text
        got = torch.tensor(r.json()["outputs"]["logits"])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    limit = 4 * 1024 * 1024  # the gateway's default max_request_size
    refused = [
        (send(body, "gzip"), 400, "does not decode as gzip"),  # plain, labelled gzip
        (send(gzip.compress(b" " * (limit * 2)), "gzip"), 413, "over the server's limit"),
        (send(body, "br"), 415, "Content-Encoding 'br' is not supported"),
    ]
    for r, status, said in refused:
        assert (r.status_code, said in r.json()["message"]) == (status, True), r.text
    assert send(gzip.compress(body), "gzip").status_code == 200  # and it keeps serving
