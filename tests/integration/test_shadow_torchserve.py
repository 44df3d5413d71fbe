"""Issue 41 on TorchServe: `pipeline serve --runtime torchserve --shadow 1.0`, one real
server for the module (started by a fixture, always stopped), serving two archives of one
export: its TorchScript file as exported, and its ONNX file altered before the archive
(resealed, as a broken exporter would leave it). Each worker checks its answers against
the same eager model, in a reference process of its own.

The TorchScript archive never diverges; the ONNX one does, and says so on TorchServe's
/metrics, in the worker's log, and with a kept sample whose replay command fails. A
start whose export is not the archived one is refused before anything starts. Last, the
TorchScript file is altered where TorchServe unpacked it (resealed) and its worker is
killed: TorchServe restarts it onto the altered file, and the check diverges.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import psutil
import pytest
import torch

from pipeline.cli import main
from pipeline.export import ExportResult
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive, archive_name
from pipeline.serving import runtime
from pipeline.serving.client import auth_headers
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import SERVER_FILE, Server
from pipeline.zoo.data import digits_sample
from tests import shadowmetrics
from tests.tamper import alter_onnx_initializer, alter_torchscript_parameter, copy_export

DIGITS = "digits_lenet"
GOOD, BAD = archive_name(DIGITS, "torchscript"), archive_name(DIGITS, "onnx")


def _weight(export_dir: Path) -> str:
    graph = onnx.load(str(export_dir / "model.onnx")).graph
    return max(graph.initializer, key=lambda t: int(np.prod(t.dims))).name


def _serve(artifacts: Path, store: Path, run_dir: Path, *archives: str) -> int:
    return main([
        "--artifacts-dir", str(artifacts), "serve", "--runtime", "torchserve",
        "--store", str(store), "--run-dir", str(run_dir), "--models", *archives,
        "--workers-per-model", "1", "--port", str(free_port()),
        "--management-port", str(free_port()), "--metrics-port", str(free_port()),
        "--shadow", "1.0", "--shadow-max-rate", "1000",
    ])  # fmt: skip


@pytest.fixture(scope="module")
def served(exported: ExportResult, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("ts-shadow")
    export_dir = copy_export(exported, root / "artifacts" / DIGITS / "export")
    alter_onnx_initializer(export_dir, _weight(export_dir), lambda w: w * np.float32(1.5))
    store = root / "store"
    archive(ArchiveConfig(model=DIGITS, export_dir=export_dir, store=store,
                          formats=("torchscript", "onnx"), bench_results=None))  # fmt: skip
    run_dir = root / "run"
    state = {"root": root, "store": store, "export_dir": export_dir, "run_dir": run_dir}
    try:
        assert _serve(root / "artifacts", store, run_dir, GOOD, BAD) == 0
        state["server"] = Server.load(run_dir)
        yield state
    finally:
        stop(run_dir)


def _requests(server: Server, name: str, n: int) -> list[str]:
    """`n` predictions through the gateway; the request ids TorchServe answered with."""
    images = digits_sample(50).numpy()  # once: each call costs ~70 ms
    ids = []
    with httpx.Client(headers=auth_headers(server, "inference"), timeout=30) as client:
        for i in range(n):
            body = {"inputs": images[i % 50 : i % 50 + 1].tolist()}
            r = client.post(f"{server.inference_url}/predictions/{name}", json=body)
            assert r.status_code == 200, r.text
            ids.append(r.headers.get("x-request-id", ""))
    return ids


def _counts(server: Server, name: str, sent: float, timeout_s: float = 30.0) -> dict[str, float]:
    """`name`'s shadow counters on TorchServe's /metrics (summed over its workers) once
    every sampled request is accounted for: checked, dropped or failed."""
    labels = rf'model_name="{name}",[^}}]*'
    return shadowmetrics.counts(f"{server.metrics_url}/metrics", labels, sent, timeout_s)


def _since(before: dict[str, float], got: dict[str, float]) -> dict[str, float]:
    return {k: got[k] - before[k] for k in shadowmetrics.KINDS}


def test_a_good_artifact_never_diverges(served: dict) -> None:
    server = served["server"]
    before = _counts(server, GOOD, 1)  # serve's warm-up request, checked like any other
    seen = sum(before.values()) - before["diverged"]
    # In bursts below a worker's reference queue (QUEUE_SIZE, 32, in handlershadow.py),
    # each accounted for before the next: an unpaced client on a loaded machine fills
    # the queue and a load-dependent share is dropped, which is not under test here.
    for sent in range(20, 201, 20):
        _requests(server, GOOD, 20)
        got = _since(before, _counts(server, GOOD, seen + sent))
    assert got["checked"] == 200 and got["dropped"] == 0 and got["failed"] == 0, got
    assert before["diverged"] == got["diverged"] == 0, (before, got)
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=10).text
    assert re.search(rf'^pipeline_shadow_error_share_bucket\{{model_name="{GOOD}",', text, re.M)


def test_an_artifact_altered_before_the_archive_diverges_and_replays(
    served: dict, tmp_path: Path
) -> None:
    server, run_dir = served["server"], served["run_dir"]
    ids = _requests(server, BAD, 20)
    got = _counts(server, BAD, 21)  # and serve's warm-up request
    assert got["diverged"] >= 10 and got["failed"] == 0, got
    log = (run_dir / "logs" / "model_log.log").read_text()
    assert re.search(rf"WARNING .*shadow check: {BAD} version 1 \(onnx\) diverged", log)
    kept = sorted((run_dir / "shadow").glob("*.json"))
    assert kept, "no divergent sample kept"
    about = json.loads(kept[-1].read_text())
    assert about["model"] == BAD and "allowance" in about["what"]
    # Named as the client saw it: TorchServe's request id, passed on by the gateway.
    assert about["request_id"] in ids and f"request id {about['request_id']}," in log
    # The kept sample replays: verify on its inputs fails the altered ONNX file.
    replay = about["replay"].split()[1:]  # drop "pipeline"; in process: no second torch import
    assert main([*replay, "--report", str(tmp_path / "parity.json"), "--batch-sizes", "1"]) == 1
    report = json.loads((tmp_path / "parity.json").read_text())
    failed = [r for r in report["rows"] if not r["passed"] and r["inputs"].startswith("file ")]
    assert failed, "the replay did not fail on the kept inputs"


def test_an_archive_of_another_export_is_refused_before_anything_starts(
    served: dict, exported: ExportResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store's ONNX archive holds the altered file; the export serve finds for the
    model here is the original: its reference would be another export's."""
    copy_export(exported, tmp_path / "artifacts" / DIGITS / "export")
    try:
        assert _serve(tmp_path / "artifacts", served["store"], tmp_path / "run", BAD) == 1
    finally:
        stop(tmp_path / "run")  # only if the check was broken and it started
    err = capsys.readouterr().err
    assert "--shadow: the onnx archive of digits_lenet holds the artifact with sha256" in err
    assert not (tmp_path / "run" / SERVER_FILE).exists()


def test_an_artifact_altered_while_serving_diverges_after_a_restart(served: dict) -> None:
    """Last in the module: it alters the TorchScript archive the first test served."""
    server = served["server"]
    (pid,) = runtime.of(server).worker_pids(server, GOOD)
    model_dir = Path(psutil.Process(pid).cwd())  # TorchServe runs the worker where it unpacked
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.load(str(model_dir / "model.torchscript.pt"))
    alter_torchscript_parameter(model_dir, next(n for n, _ in module.named_parameters()))
    before = _counts(server, GOOD, 0)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while (pids := runtime.of(server).worker_pids(server, GOOD)) in ([], [pid]):
        assert time.monotonic() < deadline, "TorchServe did not restart the worker"
        time.sleep(0.5)
    _requests(server, GOOD, 20)
    seen = sum(before[k] for k in ("checked", "dropped", "failed")) + 20
    got = _since(before, _counts(server, GOOD, seen))
    assert got["diverged"] >= 10 and got["failed"] == 0, (pids, got)
