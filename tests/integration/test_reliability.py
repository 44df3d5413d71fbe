"""Reliability under load and faults, against a real TorchServe behind the gateway.

A short load run with every answer checked, a worker SIGKILLed mid-run with
no request lost, a whole-server restart from the model store, a model that
fails to load next to one that serves, and HTTPS with a self-signed
certificate. Each server runs on free loopback ports and is always stopped.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from pipeline.export import ExportResult
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive, archive_name
from pipeline.runtimes.torchserve.launch import ServeConfig, Server, free_port, start, stop
from pipeline.serving.client import post, tensors_body
from pipeline.serving.launcher import orphans
from pipeline.serving.loadtest import LoadConfig, run, worker_pids
from pipeline.zoo.data import digits_sample
from tests.conftest import assert_kill_lost_nothing

TS = archive_name("digits_lenet", "torchscript")
ONNX = archive_name("digits_lenet", "onnx")


def _ports() -> dict[str, int]:
    return {
        "inference_port": free_port(),
        "management_port": free_port(),
        "metrics_port": free_port(),
    }


# The formats these tests serve (the session export also holds a .pt2, served in test_serving).
TS_AND_ONNX = ("torchscript", "onnx")


@pytest.fixture(scope="module")
def store(exported: ExportResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("reliability_store")
    archive(
        ArchiveConfig(
            model="digits_lenet", export_dir=exported.out_dir, store=store, formats=TS_AND_ONNX
        )
    )
    return store


@pytest.fixture(scope="module")
def run_dir(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("reliability_run")
    start(ServeConfig(store=store, run_dir=run_dir, startup_timeout_s=240, **_ports()))
    try:
        yield run_dir
    finally:
        stop(run_dir)


def _expected(exported: ExportResult, n: int) -> torch.Tensor:
    model = torch.jit.load(str(exported.out_dir / "model.torchscript.pt"))
    return model(digits_sample(n))


def test_short_load_run_every_answer_right(run_dir: Path, exported: ExportResult) -> None:
    report = run(
        LoadConfig(
            export_dir=exported.out_dir, served=TS, run_dir=run_dir, requests=1500,
            concurrency=32, time_limit_s=240,
        )
    )  # fmt: skip
    assert report.passed, report.summary()
    assert report.answered == 1500
    assert report.p50_ms > 0 and report.p99_ms >= report.p50_ms
    # Memory after 1,500 requests: no growth beyond noise (allocator caches settle early).
    assert report.worker_rss_mb_after <= report.worker_rss_mb_before * 1.1 + 30, report.summary()
    assert report.worker_pids_after == report.worker_pids_before  # nothing died


def test_worker_sigkill_mid_run_loses_nothing(run_dir: Path, exported: ExportResult) -> None:
    report = run(
        LoadConfig(
            export_dir=exported.out_dir, served=ONNX, run_dir=run_dir, requests=800,
            concurrency=32, time_limit_s=240, kill_worker_after=300,
        )
    )  # fmt: skip
    assert_kill_lost_nothing(report, 800)


def test_server_restart_brings_models_back(
    run_dir: Path, store: Path, exported: ExportResult
) -> None:
    before = Server.load(run_dir)
    assert stop(run_dir)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{before.inference_url}/ping", timeout=5)
    server = start(ServeConfig(store=store, run_dir=run_dir, startup_timeout_s=240, **_ports()))
    assert sorted(server.models) == sorted([TS, ONNX])
    expected = _expected(exported, 2)
    for name in (TS, ONNX):
        resp = post(server, name, tensors_body({"image": digits_sample(2)}))
        assert resp.status_code == 200, resp.text
        torch.testing.assert_close(
            torch.tensor(resp.json()["outputs"]["logits"]), expected, atol=1e-4, rtol=1e-4
        )


def test_a_model_that_fails_to_load_does_not_take_the_others_down(
    exported: ExportResult, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    archive(
        ArchiveConfig(
            model="digits_lenet", export_dir=exported.out_dir, store=store, formats=TS_AND_ONNX
        )
    )
    # A copy of the ONNX archive under another name, with its model file tampered.
    bad = store / "broken_onnx.mar"
    with zipfile.ZipFile(store / f"{ONNX}.mar") as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "model.onnx":
                data += b"\x00"
            elif item.filename == "MAR-INF/MANIFEST.json":
                data = data.replace(ONNX.encode(), b"broken_onnx")
            dst.writestr(item, data)
    run_dir = tmp_path / "run"
    server = start(
        ServeConfig(
            store=store, run_dir=run_dir, keep_going=True, startup_timeout_s=240, **_ports()
        )
    )
    try:
        assert server.failed == ["broken_onnx"]
        assert Server.load(run_dir).failed == ["broken_onnx"]
        for name in (TS, ONNX):
            resp = post(server, name, tensors_body({"image": digits_sample(1)}))
            assert resp.status_code == 200, resp.text
        resp = post(server, "broken_onnx", tensors_body({"image": digits_sample(1)}), retries=0)
        assert resp.status_code == 503, resp.text  # no worker: refused, and nothing else affected
        assert worker_pids(server, TS)
    finally:
        # A lost record (deleted, or a test run killed): stop finds the processes by command line.
        (run_dir / "server.json").unlink(missing_ok=True)
        stopped = stop(run_dir)
    assert stopped
    assert not orphans(run_dir.resolve())


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_with_a_self_signed_certificate(exported: ExportResult, tmp_path: Path) -> None:
    store = tmp_path / "store"
    archive(
        ArchiveConfig(
            model="digits_lenet", export_dir=exported.out_dir, store=store, formats=("torchscript",)
        )
    )
    cert, key = _self_signed(tmp_path)
    run_dir = tmp_path / "run"
    server = start(
        ServeConfig(store=store, run_dir=run_dir, tls_cert=cert, tls_key=key, **_ports())
    )
    try:
        assert server.inference_url.startswith("https://127.0.0.1:")
        body = tensors_body({"image": digits_sample(1)})
        resp = post(server, TS, body)  # the client trusts the recorded certificate
        assert resp.status_code == 200, resp.text
        torch.testing.assert_close(
            torch.tensor(resp.json()["outputs"]["logits"]),
            _expected(exported, 1),
            atol=1e-4,
            rtol=1e-4,
        )
        url = f"{server.inference_url}/predictions/{TS}"
        trusted = ssl.create_default_context(cafile=str(cert))
        assert httpx.post(url, content=body, verify=trusted, timeout=10).status_code == 401
        with pytest.raises(httpx.ConnectError):  # an untrusted certificate is rejected
            httpx.post(url, content=body, timeout=10)
        plain = server.inference_url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):  # no clear-text HTTP on the TLS port
            httpx.post(f"{plain}/predictions/{TS}", content=body, timeout=10)
    finally:
        stop(run_dir)


def test_tls_needs_both_files(tmp_path: Path) -> None:
    from pipeline.runtimes.torchserve.launch import ServeError

    with pytest.raises(ServeError, match="both --tls-cert and --tls-key"):
        start(ServeConfig(store=tmp_path, run_dir=tmp_path / "run", tls_cert=tmp_path / "c.pem"))
