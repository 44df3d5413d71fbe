"""The KServe runtime's workers (issue 28, point 3): a real `pipeline serve --runtime kserve
--workers 2` on 127.0.0.1, started by a fixture and always stopped.

Two runtime processes share the HTTP port (SO_REUSEPORT) under a supervisor: both answer,
a SIGKILLed one is replaced while the other keeps answering, `pipeline loadtest
--kill-worker-after` loses nothing (the standard of TorchServe's kill test in
test_reliability.py), and `pipeline stop` leaves no process behind.

The server traces to a real OTLP/HTTP receiver (tests/otlp.py) through the SDK's own
variables (issue 40), and serves ONNX: its workers must never load torch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

from pipeline.export import ExportResult
from pipeline.runtimes.kserve import CONFIG_FILE
from pipeline.runtimes.kserve.config import RuntimeConfig, ServedExport
from pipeline.runtimes.kserve.supervisor import all_ready_marker, ready_marker
from pipeline.serving import runtime
from pipeline.serving.client import post
from pipeline.serving.launcher import free_port, orphans, stop
from pipeline.serving.loadtest import LoadConfig, run
from pipeline.serving.server import INFERENCE_KEY_FILE, Server
from pipeline.zoo.data import digits_sample
from tests import otlp
from tests.conftest import assert_kill_lost_nothing, exited, run_cli

DIGITS = "digits_lenet"


def _serve(exported: ExportResult, run_dir: Path, env: dict[str, str]) -> Server:
    proc = run_cli(
        "serve", "--runtime", "kserve", "--workers", "2", "--export-dir", exported.out_dir,
        "--format", "onnx", "--port", free_port(), "--grpc-port", free_port(),
        "--run-dir", run_dir, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return Server.load(run_dir)


@pytest.fixture(scope="module")
def started(
    exported: ExportResult, tmp_path_factory: pytest.TempPathFactory, receiver: otlp.Receiver
) -> Iterator[dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("kserve_workers")
    env = receiver.environ("kserve-workers")
    state = {"server": _serve(exported, run_dir, env), "env": env}
    try:
        yield state
    finally:
        stop(run_dir)


@pytest.fixture
def server(started: dict[str, Any], exported: ExportResult) -> Server:
    """The module's runtime, served again if a test stopped it (test_stop_leaves_no_process
    stops it, and is last, so in file order it is served once)."""
    if not started["server"].alive():
        started["server"] = _serve(exported, Path(started["server"].run_dir), started["env"])
    return started["server"]


def _workers(server: Server) -> list[int]:
    return runtime.of(server).worker_pids(server, DIGITS)


def _key(server: Server) -> str:
    return json.loads((Path(server.run_dir) / INFERENCE_KEY_FILE).read_text())["inference"]["key"]


def _post(server: Server, headers: dict[str, str] | None = None) -> httpx.Response:
    url = f"{server.inference_url}/v2/models/{DIGITS}/infer"
    x = digits_sample(1)
    oip = {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(x.shape),
                       "data": x.flatten().tolist()}]}  # fmt: skip
    # A fresh connection each time: the kernel picks a worker per connection.
    headers = {"Authorization": f"Bearer {_key(server)}", **(headers or {})}
    return httpx.post(url, json=oip, headers=headers, timeout=30)


def _infer(server: Server) -> int:
    return _post(server).status_code


def _replaced(server: Server, killed: int, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = _workers(server)
        if len(pids) == 2 and killed not in pids:
            ready = [Path(server.run_dir) / "workers" / f"{s}.ready" for s in (0, 1)]
            if {int(p.read_text()) for p in ready if p.exists()} == set(pids):
                return pids
        time.sleep(0.2)
    raise AssertionError(f"worker {killed} not replaced within {timeout_s} s: {_workers(server)}")


def _scrape(server: Server) -> str:
    return httpx.get(f"{server.inference_url}/metrics", timeout=10).text  # a fresh connection


def _value(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_two_workers_both_answer(server: Server) -> None:
    """Both workers serve: one scrape (the workers' metrics are summed) names both live
    processes, and each worker slot has run forward passes of its own."""
    pids = _workers(server)
    assert len(pids) == 2 and server.pid not in pids
    assert httpx.get(f"{server.inference_url}/v2/health/ready").status_code == 200
    for _ in range(40):
        assert _infer(server) == 200
    text = _scrape(server)
    named = re.findall(r'^pipeline_kserve_worker\{pid="(\d+)",slot="\d"\} 1\.0$', text, re.M)
    assert sorted(map(int, named)) == sorted(pids), text[:2000]
    per_slot = [
        _value(text, f'pipeline_kserve_forward_passes_total{{model_name="{DIGITS}",slot="{s}"}}')
        for s in (0, 1)
    ]
    assert all(n > 0 for n in per_slot), per_slot  # both ran forward passes


STAGES = ("decode", "queue", "compute", "encode")


def test_a_scrape_counts_every_workers_requests_whichever_worker_answers(server: Server) -> None:
    """Summed over the workers: the request count, and the server's own split of each
    request's time (decode, queue, compute, encode), which lies within the request's."""
    series = f'pipeline_kserve_request_duration_seconds_count{{model_name="{DIGITS}"}}'
    whole = f'pipeline_kserve_request_duration_seconds_sum{{model_name="{DIGITS}"}}'
    of = f'{{format="onnx",model_name="{DIGITS}"}}'
    first = _scrape(server)
    before = _value(first, series)
    for _ in range(30):
        assert _infer(server) == 200
    scrapes = [_scrape(server) for _ in range(12)]  # fresh connections: both workers answer
    assert {_value(t, series) for t in scrapes} == {before + 30}, before
    last = scrapes[-1]
    for stage in STAGES:
        name = f"pipeline_kserve_{stage}_seconds"
        counted = _value(last, f"{name}_count{of}") - _value(first, f"{name}_count{of}")
        assert counted == 30, (stage, counted)
    split = sum(
        _value(last, f"pipeline_kserve_{s}_seconds_sum{of}")
        - _value(first, f"pipeline_kserve_{s}_seconds_sum{of}")
        for s in STAGES
    )
    assert 0 < split <= _value(last, whole) - _value(first, whole)


def test_onnx_workers_never_load_torch(server: Server) -> None:
    """Issue 40: a worker serving ONNX alone maps no libtorch and holds at most 200 MB
    (with torch imported, 650-670 MB)."""
    for pid in _workers(server):
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libtorch" not in maps, f"worker {pid} loaded torch"
        assert "onnxruntime" in maps  # what it serves with
        rss_mb = psutil.Process(pid).memory_info().rss / 2**20
        assert rss_mb <= 200, f"worker {pid} holds {rss_mb:.0f} MB"
    assert "(torch-free)" in (Path(server.run_dir) / "logs" / "kserve.out").read_text()


SPANS = {"auth", "decode", "queue", "forward", "encode"}


def _traceparent(n: int) -> tuple[str, str, str]:
    trace_id, parent = f"{n + 1:032x}", f"{n + 7:016x}"
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def test_traces_continue_the_clients_trace_over_rest_and_grpc(
    server: Server, receiver: otlp.Receiver, tmp_path: Path
) -> None:
    """Each request's spans reach a real OTLP/HTTP receiver under the client's trace id:
    the SERVER span is the child of the client's span and holds auth, decode, queue,
    forward (model, format, batch size) and encode; the answer names the trace in
    `traceresponse` and the access log in `trace_id=`. Fresh connections: both workers."""
    sent = []
    for n in range(6):
        trace_id, parent, header = _traceparent(n)
        resp = _post(server, {"traceparent": header})
        assert resp.status_code == 200
        assert resp.headers["traceresponse"].split("-")[1] == trace_id
        sent.append((trace_id, parent))
    for trace_id, parent in sent:
        spans = receiver.spans_of(trace_id, SPANS | {"POST /v2/models/{model}/infer"})
        (root,) = [s for s in spans if s.parent_id == parent]
        assert root.service == "kserve-workers" and root.kind == 2  # SERVER
        assert root.attributes["http.response.status_code"] == 200
        children = {s.name: s for s in spans if s.parent_id == root.span_id}
        assert set(children) == SPANS, [s.name for s in spans]
        forward = children["forward"].attributes
        assert (forward["model.name"], forward["model.format"]) == (DIGITS, "onnx")
        assert forward["batch.size"] >= 1
        assert root.start_ns <= children["decode"].start_ns <= children["encode"].end_ns
    log = (Path(server.run_dir) / "logs" / "kserve.out").read_text()
    assert all(f"trace_id={t}" in log for t, _ in sent)
    # No traceparent: the server starts a trace, and says which.
    started = _post(server).headers["traceresponse"].split("-")[1]
    assert {s.name for s in receiver.spans_of(started, SPANS)} >= SPANS
    # gRPC, with Triton's client (a process of its own: tests/triton_grpc.py says why):
    # the traceparent travels as metadata.
    trace_id, parent, header = _traceparent(99)
    np.save(tmp_path / "x.npy", digits_sample(1).numpy())
    proc = subprocess.run(
        [sys.executable, "-m", "tests.triton_grpc", "infer",
         server.extras["grpc_url"].removeprefix("grpc://"), _key(server), DIGITS, "image",
         tmp_path / "x.npy", "logits", tmp_path / "y.npy"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TRACEPARENT": header},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    spans = receiver.spans_of(trace_id, SPANS | {"grpc ModelInfer"})
    (root,) = [s for s in spans if s.parent_id == parent]
    assert root.name == "grpc ModelInfer"
    grpc_children = {s.name: s for s in spans if s.parent_id == root.span_id}
    assert set(grpc_children) == SPANS
    assert grpc_children["auth"].attributes.get("auth.result") == "ok"  # as REST's says


def test_readiness_is_400_until_every_worker_serves(exported: ExportResult, tmp_path: Path) -> None:
    """A worker answers /v2/health/ready with 400 {"ready": false} (Triton's answer; the
    protocol asks for a 4xx) while it already serves inference, until the supervisor marks
    every worker ready; then 200. One real worker process, started as the supervisor
    starts it, with no supervisor to write the mark."""
    port = free_port()
    conf = tmp_path / CONFIG_FILE
    RuntimeConfig(
        models=[ServedExport(DIGITS, str(exported.out_dir), "onnx")],
        http_port=port, grpc_port=free_port(), workers=2,
    ).write(conf)  # fmt: skip
    ready_marker(conf, 0).parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.runtimes.kserve.runtime", str(conf), "--worker", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/v2"
        deadline = time.monotonic() + 60
        while not ready_marker(conf, 0).exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.1)
        answer = httpx.get(f"{url}/health/ready", timeout=10)
        assert (answer.status_code, answer.json()) == (400, {"ready": False})
        x = digits_sample(1)
        oip = {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(x.shape),
                           "data": x.flatten().tolist()}]}  # fmt: skip
        assert httpx.post(f"{url}/models/{DIGITS}/infer", json=oip, timeout=10).status_code == 200
        all_ready_marker(conf).touch()
        assert httpx.get(f"{url}/health/ready", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_kept_alive_requests_do_not_wait_for_delayed_acks(server: Server) -> None:
    """The workers' own sockets must set TCP_NODELAY as uvicorn's do: without it each
    kept-alive request waited ~40 ms (Nagle against the client's delayed ACK)."""
    key = json.loads((Path(server.run_dir) / INFERENCE_KEY_FILE).read_text())["inference"]["key"]
    body = runtime.of(server).protocol.encode({"image": digits_sample(1)})
    url = f"{server.inference_url}/v2/models/{DIGITS}/infer"
    headers = {"Authorization": f"Bearer {key}", **body.headers}
    took = []
    with httpx.Client(headers=headers, timeout=30) as http:
        for _ in range(31):
            t0 = time.perf_counter()
            assert http.post(url, content=body.content).status_code == 200
            took.append(time.perf_counter() - t0)
    assert sorted(took)[15] < 0.02, took  # ~1.5 ms here; 40 ms is the delayed ACK


def test_killed_worker_is_replaced_and_the_server_keeps_answering(server: Server) -> None:
    before = _workers(server)
    os.kill(before[0], signal.SIGKILL)
    body = runtime.of(server).protocol.encode({"image": digits_sample(1)})
    for _ in range(20):  # the other worker answers meanwhile (the client resends a reset)
        assert post(server, DIGITS, body.content, body.content_type).status_code == 200
    after = _replaced(server, before[0])
    assert before[1] in after
    log = (Path(server.run_dir) / "logs" / "kserve.out").read_text()
    assert re.search(
        rf"worker \d \(pid {before[0]}\) exited with signal SIGKILL; started pid \d+ in its place",
        log,
    ), log[-2000:]
    assert httpx.get(f"{server.inference_url}/v2/health/ready").status_code == 200
    for _ in range(10):
        assert _infer(server) == 200


def test_worker_sigkill_mid_loadtest_loses_nothing(server: Server, exported: ExportResult) -> None:
    """As TorchServe's (test_reliability.test_worker_sigkill_mid_run_loses_nothing)."""
    _replaced(server, -1)  # both workers up, whatever the tests before did
    report = run(
        LoadConfig(
            export_dir=exported.out_dir, run_dir=Path(server.run_dir), format="onnx",
            requests=800, concurrency=32, time_limit_s=240, kill_worker_after=300,
        )
    )  # fmt: skip
    assert_kill_lost_nothing(report, 800)


def test_bench_sweep_measures_and_serve_follows_it(
    exported: ExportResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench's worker sweep on a real runtime, few requests, one count (2 workers: the
    # counts it tries are unit-tested, each start costs seconds): both levels measured,
    # nothing failed, and the count it calls best is what `choose` (serve's default, and
    # bench's private runtimes') then gives.
    from pipeline.export.opened import open_export
    from pipeline.runtimes.kserve import sweep

    monkeypatch.setattr(sweep, "candidates", lambda: [2])
    opened = open_export(exported.out_dir)
    found = sweep.sweep(DIGITS, opened, requests=16, budget_s=2.0)
    assert found is not None and found["format"] == "onnx"
    assert {(p["workers"], p["concurrency"]) for p in found["points"]} == {(2, 8), (2, 32)}
    assert all(p["failed"] == 0 and p["throughput"] > 0 for p in found["points"])
    assert found["best"] == 2
    sweep.write(tmp_path, {opened.name: found})
    assert sweep.choose(tmp_path, [DIGITS]).workers == 2
    # What bench's private runtimes start with it: tests/unit/test_kserve_sweep.py.


def test_stop_leaves_no_process(server: Server) -> None:
    """`pipeline stop` on the module's runtime (served by `pipeline serve --workers 2`, as
    every test here; a worker killed and replaced on the way): nothing is left."""
    run_dir = Path(server.run_dir)
    try:
        family = [server.pid, *_replaced(server, -1)]  # both workers up
        assert len(family) == 3
        proc = run_cli("stop", "--run-dir", run_dir)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        marker = str(run_dir / CONFIG_FILE)
        left = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if marker in (p.info.get("cmdline") or [])
        ]
        assert left == [] and orphans(run_dir) == []
        assert all(exited(pid) for pid in family)
    finally:
        stop(run_dir)
