"""Issue 51: the Ray Serve runtime on a real three-node Ray cluster, one machine, loopback.

One cluster for the module, started as a user starts it (`pipeline serve --runtime ray
--ray-nodes 2 --ray-replicas 2`): a head holding the proxy and the ingress, two 1-CPU
worker nodes, each with one replica of the digits ONNX export. Its tests read it first
(where the replicas run, what listens, Triton's client, the token, bad requests, verify),
then lose a worker node under load, then stop it: in that order, the last two change it.
A second run joins the cluster (`joined`), loses its replica to a changed file, and stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as thttp

from pipeline.export import ExportResult
from pipeline.export.opened import open_export
from pipeline.serving.launcher import free_port
from pipeline.serving.loadtest import LoadConfig, LoadTestError, run
from pipeline.serving.server import INFERENCE_KEY_FILE, Server
from pipeline.serving.wire import oip_json
from tests.conftest import run_cli
from tests.tamper import copy_export


@pytest.fixture(scope="module")
def cluster(exported: ExportResult, tmp_path_factory: pytest.TempPathFactory) -> Any:
    run_dir = tmp_path_factory.mktemp("ray") / "run"
    started = run_cli(
        "serve", "--runtime", "ray", "--ray-export-dir", exported.out_dir, "--ray-format", "onnx",
        "--ray-nodes", "2", "--ray-replicas", "2", "--port", free_port(), "--run-dir", run_dir,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    try:
        yield Server.load(run_dir), started.stdout
    finally:
        run_cli("stop", "--run-dir", run_dir)


def _state(server: Server) -> dict[str, Any]:
    return json.loads((Path(server.run_dir) / "ray_state.json").read_text())


def _key(server: Server) -> str:
    return json.loads((Path(server.run_dir) / INFERENCE_KEY_FILE).read_text())["inference"]["key"]


def _ray_processes(server: Server) -> list[psutil.Process]:
    """The host process and everything under it: the nodes' GCS, raylets and agents, and
    the Ray workers (controller, proxy, replicas) the raylets started."""
    host = psutil.Process(server.pid)
    return [host, *host.children(recursive=True)]


def test_deploy_ray_writes_a_rayservice_kuberay_would_take(
    exported: ExportResult, tmp_path: Path
) -> None:
    """`pipeline deploy ray` as a user runs it: the RayService is valid against KubeRay's
    CRD schema, and the image it names carries the export and the project."""
    from pipeline.runtimes.ray.deploy import errors
    from pipeline.serving.crd import iter_documents

    out = tmp_path / "deploy"
    proc = run_cli("deploy", "ray", "--export-dir", exported.out_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (manifest,) = iter_documents((out / "rayservice.yaml").read_text())
    assert errors(manifest) == []
    assert (out / "export" / "manifest.json").is_file() and (out / "src" / "pipeline").is_dir()
    assert "COPY export/ /opt/pipeline/export/" in (out / "Dockerfile").read_text()
    # Replicas open the TorchScript export with its eager model: the checkpoint is carried
    # (without it every replica failed to start three times, then the deployment).
    from pipeline.export.opened import open_export

    assert open_export(out / "export").checkpoint == out / "export" / "checkpoint.pt"
    again = run_cli("deploy", "ray", "--export-dir", exported.out_dir, "--out", out)
    assert again.returncode == 1 and "is not empty; pass --force" in again.stderr


def test_two_replicas_on_two_worker_nodes_and_nothing_listens_beyond_loopback(cluster) -> None:
    server, said = cluster
    assert "a head and 2 worker node(s) of 1 CPU(s)" in said, said
    state = _state(server)
    workers = {n["node_id"] for n in state["nodes"] if not n["head"]}
    assert len(state["nodes"]) == 3 and len(workers) == 2, state["nodes"]
    replicas = state["replicas"]["digits_lenet"]
    assert len(replicas) == 2, replicas
    assert {r["node_id"] for r in replicas} == workers  # one on each worker node
    # The run folder names Serve's own processes beside the nodes' (what stop must end).
    assert set(state["serve_pids"]) == {"ServeController", "ProxyActor"}, state["serve_pids"]
    timings = json.loads((Path(server.run_dir) / "ray_timings.json").read_text())
    assert set(timings) == {"cluster_s", "serve_s", "replicas_s"}
    assert all(v > 0 for v in timings.values()), timings
    listening = []
    for proc in _ray_processes(server):
        with contextlib.suppress(psutil.NoSuchProcess):  # psutil 5.9: connections()
            conns = proc.connections(kind="inet")
            listening += [(proc.name(), c.laddr) for c in conns if c.status == psutil.CONN_LISTEN]
    assert listening, "the cluster listens somewhere"
    wide = [(n, a) for n, a in listening if a.ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert wide == [], wide


def test_tritonclient_gets_eagers_answer_with_the_token_and_401_without(
    cluster, exported: ExportResult
) -> None:
    server, _ = cluster
    opened = open_export(exported.out_dir)
    inputs, outputs = opened.golden()
    (x,) = (t.numpy() for t in inputs.values())
    (y,) = (t.numpy() for t in outputs.values())
    tol = opened.manifest.tolerance
    name, out = opened.manifest.inputs[0].name, opened.manifest.output_names[0]
    client = thttp.InferenceServerClient(server.inference_url.removeprefix("http://"))
    try:
        for binary in (False, True):
            tensor = thttp.InferInput(name, list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            wanted = thttp.InferRequestedOutput(out, binary_data=binary)
            result = client.infer("digits_lenet", [tensor], outputs=[wanted],
                                  headers={"Authorization": f"Bearer {_key(server)}"})  # fmt: skip
            np.testing.assert_allclose(result.as_numpy(out), y, atol=tol.atol, rtol=tol.rtol)
        # An output the model lacks: a 400 that names it (it was a 200 with every output).
        with pytest.raises(thttp.InferenceServerException) as unknown:
            client.infer("digits_lenet", [tensor], outputs=[thttp.InferRequestedOutput("nope")],
                         headers={"Authorization": f"Bearer {_key(server)}"})  # fmt: skip
        assert unknown.value.status() == "400", unknown.value
        assert "No output named ['nope']" in unknown.value.message()
        meta = client.get_model_metadata(
            "digits_lenet", headers={"Authorization": f"Bearer {_key(server)}"}
        )
        assert meta["inputs"][0]["name"] == name and meta["platform"] == "onnxruntime_onnx"
        tensor = thttp.InferInput(name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        with pytest.raises(thttp.InferenceServerException) as refused:
            client.infer("digits_lenet", [tensor])
        assert refused.value.status() == "401"
    finally:
        client.close()


def test_bad_requests_get_4xx_json_and_the_server_keeps_serving(cluster) -> None:
    server, _ = cluster
    auth = {"Authorization": f"Bearer {_key(server)}"}
    url = server.inference_url
    cases = {
        "/v2/models/digits_lenet/infer": (b"{not json", 400),
        "/v2/models/nope/infer": (b"{}", 404),
    }
    for path, (body, status) in cases.items():
        r = httpx.post(url + path, content=body, headers=auth, timeout=30)
        assert r.status_code == status and "error" in r.json(), (path, r.status_code, r.text)
    wrong = {"inputs": [{"name": "nope", "datatype": "INT64", "shape": [1], "data": [1.5]}]}
    r = httpx.post(f"{url}/v2/models/digits_lenet/infer", json=wrong, headers=auth, timeout=30)
    assert r.status_code == 400 and "must be named" in r.json()["error"], r.text
    big = b"0" * (4 * 1024 * 1024 + 1)  # over the default --max-request-size
    r = httpx.post(f"{url}/v2/models/digits_lenet/infer", content=big, headers=auth, timeout=30)
    assert r.status_code == 413 and "max_request_size" in r.json()["error"], r.text
    assert httpx.get(f"{url}/v2/health/ready", timeout=10).json() == {"ready": True}
    # The KServe runtime's reader and words (pipeline_runtime.oiprest), not int()'s.
    r = httpx.post(f"{url}/v2/models/digits_lenet/infer", content=b"{}", timeout=30,
                   headers=auth | {"Inference-Header-Content-Length": "abc"})  # fmt: skip
    assert r.status_code == 400 and "is not a number" in r.json()["error"], r.text
    meta = httpx.get(f"{url}/v2", headers=auth, timeout=10).json()
    assert meta["extensions"] == ["binary_tensor_data"], meta  # the binary extension: read


def test_verify_backend_ray_passes(cluster, exported: ExportResult, tmp_path: Path) -> None:
    server, _ = cluster
    proc = run_cli("verify", "--export-dir", exported.out_dir, "--backend", "ray",
                   "--run-dir", server.run_dir, "--report", tmp_path / "parity.json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "parity.json").read_text())["rows"]
    assert any(r["backend"].startswith("ray") and r["passed"] for r in rows), rows


@pytest.fixture(scope="module")
def joined(cluster, exported: ExportResult, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`--ray-address`: a second run on the module's cluster, serving a copy of the export
    (a test changes it on disk): {server, run_dir, export_dir, stdout}. Stopped by its
    last test, and here again whatever happened."""
    server, _ = cluster
    root = tmp_path_factory.mktemp("joined")
    export_dir = copy_export(exported, root / "export")
    run_dir = root / "run"
    started = run_cli(
        "serve", "--runtime", "ray", "--ray-export-dir", export_dir, "--ray-format", "onnx",
        "--ray-address", _state(server)["address"], "--ray-replica-cpus", "0",
        "--port", free_port(), "--run-dir", run_dir,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    try:
        yield {"server": Server.load(run_dir), "run_dir": run_dir, "export_dir": export_dir,
               "stdout": started.stdout}  # fmt: skip
    finally:
        run_cli("stop", "--run-dir", run_dir)


def test_a_run_joins_the_cluster_under_a_path_of_its_own(
    cluster, joined: dict[str, Any], tmp_path: Path
) -> None:
    """A second run deploys its own application on the running cluster, under a path of
    its own on the cluster's proxy, with its own token."""
    server, second = cluster[0], joined["server"]
    assert second.inference_url.startswith(server.inference_url + "/pipeline-"), second
    assert "this run answers there" in joined["stdout"]  # the cluster's proxy: not --port
    logs = re.search(r"\(Ray's own: (\S+)\)", joined["stdout"])  # this session's, not the latest
    assert logs and Path(logs[1]).is_dir() and "session_latest" not in logs[1], joined["stdout"]
    verified = run_cli(
        "verify", "--export-dir", joined["export_dir"], "--backend", "ray",
        "--run-dir", joined["run_dir"], "--report", tmp_path / "parity.json",
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]


def _after(delay: float, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    time.sleep(delay)
    return httpx.post(url, content=body, headers=headers, timeout=90)


def test_a_model_whose_replica_cannot_load_is_not_ready_and_answers_503_with_why(
    cluster, joined: dict[str, Any]
) -> None:
    """A replica that dies and cannot load its export again (here the file changed on
    disk): Serve retries it, and requests used to wait for it until the client gave up
    while readiness said ready. Now: not ready, and 503 with Serve's reason, also for the
    requests sent as it died, before Serve knew (those waited in Serve's router without
    end: a user's curl at +0 s and +1 s had no answer after 180 s)."""
    server, second = cluster[0], joined["server"]
    auth = {"Authorization": f"Bearer {_key(second)}"}  # each run has its own token
    model = f"{second.inference_url}/v2/models/digits_lenet"
    assert httpx.get(f"{model}/ready", headers=auth, timeout=30).status_code == 200
    body = oip_json(open_export(joined["export_dir"]).sample(1, seed=0))
    headers = auth | {"Content-Type": "application/json"}
    (joined["export_dir"] / "model.onnx").write_bytes(b"changed on disk")
    os.kill(_state(second)["replicas"]["digits_lenet"][0]["pid"], signal.SIGKILL)
    with ThreadPoolExecutor(3) as pool:  # at once, 0.5 s and 1 s after the kill
        sent = [
            pool.submit(_after, delay, f"{model}/infer", body, headers) for delay in (0, 0.5, 1)
        ]
        early = [f.result() for f in sent]
    for answer in early:  # each answered (httpx's timeout would raise), and not with a 200
        assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # first "health check failed", then the cause
        ready = httpx.get(f"{model}/ready", headers=auth, timeout=30)
        if "modified after export" in ready.text:
            break
        time.sleep(0.5)
    assert ready.status_code == 503 and ready.json()["ready"] is False, ready.text
    assert "modified after export" in ready.json()["error"], ready.text
    answer = httpx.post(f"{model}/infer", content=body, headers=headers, timeout=60)
    assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
    assert "no replica of 'digits_lenet' is running" in answer.json()["error"], answer.text
    assert "modified after export" in answer.json()["error"], answer.text
    health = httpx.get(f"{second.inference_url}/v2/health/ready", headers=auth, timeout=30)
    assert health.status_code == 503, health.text
    said = run_cli("status", "--run-dir", joined["run_dir"]).stdout  # and `status` says why
    assert re.search(r"^  digits_lenet: .*; NOT READY: .*modified after export", said, re.M), said
    # The module's own run, on the same cluster, is not touched.
    first = httpx.get(
        f"{server.inference_url}/v2/health/ready",
        headers={"Authorization": f"Bearer {_key(server)}"},
        timeout=30,
    )
    assert first.status_code == 200, first.text


def test_a_joined_run_asking_for_gpus_the_cluster_lacks_is_refused(
    cluster, exported: ExportResult, tmp_path: Path
) -> None:
    """Serve would wait for GPUs the cluster does not have without end: the run says so and
    ends, and the cluster's own run keeps serving."""
    server, _ = cluster
    proc = run_cli(
        "serve", "--runtime", "ray", "--ray-export-dir", exported.out_dir,
        "--ray-address", _state(server)["address"], "--ray-replica-gpus", "1",
        "--port", free_port(), "--run-dir", tmp_path / "run",
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--ray-replica-gpus 1: the cluster has 0 GPU(s)" in proc.stderr, proc.stderr[-3000:]
    assert httpx.get(f"{server.inference_url}/v2/health/ready", timeout=10).status_code == 200


def test_a_joined_run_that_cannot_deploy_says_why_and_leaves_nothing_on_the_cluster(
    cluster, exported: ExportResult, tmp_path: Path
) -> None:
    """A replica that cannot load at start: serve showed a traceback ("Failed to update the
    deployments"), not the replica's error, and left its application on the shared
    cluster (DEPLOY_FAILED, its ingress running), where `pipeline stop` could not reach
    it. Now the error is said and the application removed before serve exits."""
    server, _ = cluster
    export_dir = copy_export(exported, tmp_path / "export")
    (export_dir / "model.onnx").write_bytes(b"changed on disk")
    proc = run_cli(
        "serve", "--runtime", "ray", "--ray-export-dir", export_dir, "--ray-format", "onnx",
        "--ray-address", _state(server)["address"], "--ray-replica-cpus", "0",
        "--port", free_port(), "--run-dir", tmp_path / "run",
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said[-3000:]
    assert "was not deployed" in said and "modified after export" in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    app = re.search(r"removed (pipeline-[0-9a-f]{8}) from the cluster", said)
    assert app, said[-3000:]
    # Its path on the proxy is the cluster's own run's again (the route "/"): a 404 there.
    auth = {"Authorization": f"Bearer {_key(server)}"}
    gone = httpx.get(f"{server.inference_url}/{app[1]}/v2/health/live", headers=auth, timeout=30)
    assert gone.status_code == 404, gone.text
    assert httpx.get(f"{server.inference_url}/v2/health/ready", timeout=10).status_code == 200


def test_a_joined_runs_stop_removes_only_its_application(cluster, joined: dict[str, Any]) -> None:
    server, second = cluster[0], joined["server"]
    stopped = run_cli("stop", "--run-dir", joined["run_dir"])
    assert stopped.returncode == 0, stopped.stderr
    auth = {"Authorization": f"Bearer {_key(server)}"}
    gone = httpx.get(f"{second.inference_url}/v2/models/digits_lenet", headers=auth, timeout=30)
    assert gone.status_code == 404, gone.text  # the first run's ingress: no such route
    kept = httpx.get(f"{server.inference_url}/v2/models/digits_lenet", headers=auth, timeout=30)
    assert kept.status_code == 200, kept.text
    assert len(_state(server)["nodes"]) == 3  # nothing of the cluster was stopped


def test_a_worker_node_lost_under_load_costs_no_wrong_answer(
    cluster, exported: ExportResult
) -> None:
    """The issue's bar: 0 wrong, every failure retried or counted, and the model answering
    again from the surviving node within 30 s of the kill."""
    server, _ = cluster
    requests = 600
    report = run(
        LoadConfig(export_dir=exported.out_dir, run_dir=Path(server.run_dir), requests=requests,
                   concurrency=4, pool=16, kill_node_after=150, time_limit_s=120)
    )  # fmt: skip
    assert report.killed_node is not None, report.summary()
    assert report.wrong == 0 and report.server_errors == 0, report.summary()
    assert report.answered + report.failed == requests and report.not_sent == 0, report.summary()
    assert report.node_recovery_s is not None and report.node_recovery_s < 30, report.summary()
    left = {r["node_id"] for r in _state(server)["replicas"]["digits_lenet"]}
    assert report.killed_node not in left and left, (report.killed_node, left)


def test_after_the_node_loss_it_is_reaped_marked_and_the_last_node_is_not_killed(
    cluster, exported: ExportResult
) -> None:
    """A user's trial (2026-11-29): the lost node's processes stayed <defunct> under the
    host until stop, ray_state.json still listed the node, and a second node kill took
    the last node serving the model. Reuses the module's cluster, after the node loss."""
    server, _ = cluster
    host = psutil.Process(server.pid)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        defunct = [c.pid for c in host.children() if c.status() == psutil.STATUS_ZOMBIE]
        lost = [n for n in _state(server)["nodes"] if n.get("dead")]
        if not defunct and lost:
            break
        time.sleep(0.5)
    assert defunct == [], defunct  # reaped while serving, not only at stop
    assert len(lost) == 1 and not lost[0]["head"], _state(server)["nodes"]
    with pytest.raises(LoadTestError, match=r"1 worker node\(s\) serve digits_lenet"):
        run(
            LoadConfig(export_dir=exported.out_dir, run_dir=Path(server.run_dir),
                       requests=100, concurrency=2, pool=4, kill_node_after=10)
        )  # fmt: skip
    auth = {"Authorization": f"Bearer {_key(server)}"}
    ready = httpx.get(f"{server.inference_url}/v2/models/digits_lenet/ready", headers=auth)
    assert ready.status_code == 200, ready.text  # the surviving node was not killed


def test_stop_leaves_no_ray_process_it_started(cluster) -> None:
    server, _ = cluster
    started = _ray_processes(server)
    assert len(started) > 5, started
    stopped = run_cli("stop", "--run-dir", server.run_dir)
    assert stopped.returncode == 0, stopped.stderr
    alive = []
    for proc in started:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append((proc.pid, proc.name()))
        except psutil.NoSuchProcess:
            pass
    assert alive == [], alive
