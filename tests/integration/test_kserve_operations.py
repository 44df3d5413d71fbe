"""Operating the KServe runtime (issue 28, point 4), against the real runtime on 127.0.0.1:

* the inference token outlives `pipeline stop` and the next `pipeline serve`, so a client
  holding it keeps working; `--rotate-token` replaces it; a key file that is not fit
  (bad JSON, world-readable) is replaced, and the log says so;
* /metrics on loopback answers a scrape without a token, in Prometheus's text format.

Every server is started by the test or fixture that uses it and always stopped. The
non-loopback rule (the metrics key) is in tests/unit/test_kserve_keys.py: these tests
only listen on loopback.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline.core import fileio
from pipeline.export import ExportResult
from pipeline.runtimes.kserve.config import RuntimeConfig
from pipeline.runtimes.kserve.launch import served_export, start
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import INFERENCE_KEY_FILE, Server
from tests.conftest import run_cli

MODEL = "digits_lenet"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client's 0.0.4
# What Prometheus 2.x and 3.x send when scraping (scrape_protocols' defaults, in order).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def _serve(export_dir: Path, run_dir: Path, *extra: str) -> tuple[Server, str]:
    """`pipeline serve --runtime kserve` as a user runs it → (its record, its output)."""
    proc = run_cli(
        "serve", "--runtime", "kserve", "--export-dir", export_dir, "--format", "onnx",
        "--port", free_port(), "--grpc-port", free_port(), "--run-dir", run_dir, *extra,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Server.load(run_dir), proc.stdout + proc.stderr


def _stop(run_dir: Path) -> None:
    """`pipeline stop` as a user runs it, which must stop the runtime."""
    proc = run_cli("stop", "--run-dir", run_dir)
    assert proc.returncode == 0 and "stopped the KServe runtime" in proc.stdout, proc.stdout


def _key(run_dir: Path) -> str:
    return json.loads((run_dir / INFERENCE_KEY_FILE).read_text())["inference"]["key"]


def _infer(server: Server, token: str) -> int:
    body = {
        "inputs": [
            {
                "name": "image",
                "shape": [1, 1, 28, 28],
                "datatype": "FP32",
                "data": np.zeros(784, np.float32).tolist(),
            }
        ]
    }
    r = httpx.post(
        f"{server.inference_url}/v2/models/{MODEL}/infer",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert r.status_code in (200, 401), r.text
    return r.status_code


def test_the_token_survives_stop_and_serve(exported: ExportResult, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    try:
        first, said = _serve(exported.out_dir, run_dir)
        assert "(new;" in said
        token = _key(run_dir)
        assert _infer(first, token) == 200
        _stop(run_dir)
        # `pipeline stop` leaves the token in place, still owner-only.
        assert _key(run_dir) == token
        assert stat.S_IMODE((run_dir / INFERENCE_KEY_FILE).stat().st_mode) == 0o600
        second, said = _serve(exported.out_dir, run_dir)
        assert second.pid != first.pid
        assert "kept from the previous start" in said and "must read" not in said
        assert _key(run_dir) == token
        assert _infer(second, token) == 200  # the old client, unchanged
        assert _infer(second, "x" * 43) == 401  # still a token check, not an open door
        _stop(run_dir)
        assert _key(run_dir) == token
    finally:
        stop(run_dir)  # whatever is left when an assertion failed


def test_rotate_token_replaces_it(exported: ExportResult, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # What a previous start left: a fit key file the next start would keep.
    old = "o" * 43
    fileio.write_secret(run_dir / INFERENCE_KEY_FILE, {"inference": {"key": old}})
    try:
        server, said = _serve(exported.out_dir, run_dir, "--rotate-token")
        new = _key(run_dir)
        assert new != old and len(new) >= 43
        assert f"clients must read {run_dir.resolve() / INFERENCE_KEY_FILE} again" in said
        assert new not in said  # the token is never printed or logged
        assert _infer(server, old) == 401
        assert _infer(server, new) == 200
        _stop(run_dir)
    finally:
        stop(run_dir)


def _bad_json(path: Path) -> tuple[str, str]:
    """→ (what the log must say, the key the file held)."""
    fileio.write_secret(path, {"inference": {"key": "b" * 43}})
    path.write_text('{"inference": {"key": "' + "b" * 43)  # cut short
    return "is not JSON", "b" * 43


def _world_readable(path: Path) -> tuple[str, str]:
    fileio.write_secret(path, {"inference": {"key": "w" * 43}})
    path.chmod(0o644)  # anyone on the machine could have read it: not a secret any more
    return "has mode 0644, not 0600", "w" * 43


@pytest.mark.parametrize("tamper", [_bad_json, _world_readable])
def test_an_unfit_key_file_is_replaced_with_a_log_line(
    exported: ExportResult, tmp_path: Path, tamper: Callable[[Path], tuple[str, str]]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    key_file = run_dir / INFERENCE_KEY_FILE
    reason, old = tamper(key_file)
    try:
        server, said = _serve(exported.out_dir, run_dir)
        line = next((ln for ln in said.splitlines() if reason in ln), "")
        assert line.startswith("WARNING") and str(run_dir.resolve() / INFERENCE_KEY_FILE) in line
        assert "replaced it with a new inference token" in line, said
        assert "clients must read" in said
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        new = _key(run_dir)
        assert new not in said
        assert _infer(server, new) == 200
        assert new != old and _infer(server, old) == 401
        _stop(run_dir)
    finally:
        stop(run_dir)


@pytest.fixture(scope="module")
def loopback_server(
    exported: ExportResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("kserve_ops")
    config = RuntimeConfig(
        models=[served_export(exported.out_dir, "onnx")],
        http_port=free_port(),
        grpc_port=free_port(),
    )
    try:
        yield start(config, run_dir)
    finally:
        stop(run_dir)


def test_metrics_on_loopback_need_no_token(loopback_server: Server) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    server = loopback_server
    assert not (Path(server.run_dir) / "metrics_key.json").exists()  # not needed on loopback
    assert _infer(server, _key(Path(server.run_dir))) == 200  # something to count
    r = httpx.get(f"{server.inference_url}/metrics")  # a scrape: no Authorization header
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == PROMETHEUS_TEXT
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert families["pipeline_kserve_batch_size"].type == "histogram"
    assert families["pipeline_kserve_warmed_up"].type == "gauge"
    # Prometheus's naming conventions (prometheus.io/docs/practices/naming): counters end
    # in _total, time is in seconds; every family says what it is.
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", r.text, re.M))
    helps = set(re.findall(r"^# HELP (\S+) ", r.text, re.M))
    assert types and set(types) == helps
    for name, kind in types.items():
        assert kind != "counter" or name.endswith("_total"), name
        assert not re.search(r"_(ms|millis\w*|milliseconds|us|micro\w*)(_|$)", name), name
    assert "request_predict_seconds" in families  # kserve's latency histogram, in seconds
    # ... and it counts REST requests too (the fast path answers them, not kserve's route).
    predicted = {
        s.labels["model_name"]: s.value
        for s in families["request_predict_seconds"].samples
        if s.name == "request_predict_seconds_count"
    }
    assert predicted.get(MODEL, 0) >= 1, predicted
    # Prometheus itself asks for OpenMetrics first, and gets it.
    om = httpx.get(f"{server.inference_url}/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert om.status_code == 200
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.rstrip().endswith("# EOF")
    # The rest of the API still needs the inference token.
    assert httpx.get(f"{server.inference_url}/v2/models/{MODEL}").status_code == 401
