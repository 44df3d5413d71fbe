"""Issue 41: the KServe runtime's live shadow check, on a real `pipeline serve --runtime
kserve --shadow 1.0` on 127.0.0.1 (started by a fixture, always stopped; one worker under
the supervisor: its metrics are the multiprocess files every worker's are summed from).

Every shadow counter has its series at 0 before the first request. A good artifact:
every sampled answer agrees with eager (diverged 0 after 200 requests on
/metrics). Then the served file is altered on disk (resealed, as a broken exporter would
leave it) and the worker is killed: the supervisor restarts it onto the file and the
check counts divergences, logs them and keeps samples that `pipeline verify --inputs`
replays. Started again from the altered file (altered before the start),
the check finds it too. The rules themselves are checked in process at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import torch

from pipeline.export import ExportResult
from pipeline.serving import runtime
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import INFERENCE_KEY_FILE, Server
from pipeline.serving.shadowref import Sample, check
from pipeline.zoo.data import digits_sample
from tests import shadowmetrics
from tests.conftest import run_cli
from tests.tamper import alter_onnx_initializer, copy_export

DIGITS = "digits_lenet"
LABEL = f'format="onnx",model_name="{DIGITS}",version="1"'  # as Prometheus sorts them


def _serve(export_dir: Path, run_dir: Path) -> Server:
    proc = run_cli(
        "serve", "--runtime", "kserve", "--workers", "1", "--export-dir", export_dir,
        "--format", "onnx", "--port", free_port(), "--grpc-port", free_port(),
        "--run-dir", run_dir, "--shadow", "1.0", "--shadow-max-rate", "1000",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return Server.load(run_dir)


@pytest.fixture(scope="module")
def served(exported: ExportResult, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("shadow")
    export_dir = copy_export(exported, root / "export")
    state = {"export_dir": export_dir, "run_dir": root / "run"}
    state["server"] = _serve(export_dir, state["run_dir"])
    try:
        yield state
    finally:
        stop(state["run_dir"])


def _requests(server: Server, n: int, first: int = 0) -> None:
    key = json.loads((Path(server.run_dir) / INFERENCE_KEY_FILE).read_text())["inference"]["key"]
    url = f"{server.inference_url}/v2/models/{DIGITS}/infer"
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        for i in range(first, first + n):
            x = digits_sample(1, offset=i % 50)
            body = {"id": f"req-{i}", "inputs": [{"name": "image", "datatype": "FP32",
                    "shape": list(x.shape), "data": x.flatten().tolist()}]}  # fmt: skip
            r = client.post(url, json=body)
            assert r.status_code == 200, r.text


def _counts(server: Server, sent: float, timeout_s: float = 90.0) -> dict[str, float]:
    """The shadow counters once every sampled request is accounted for, summed over the
    workers."""
    return shadowmetrics.counts(f"{server.inference_url}/metrics", LABEL, sent, timeout_s)


def test_every_shadow_series_starts_at_zero(served: dict) -> None:
    # Before any request: an alert on divergences has a series to read on a healthy server.
    text = httpx.get(f"{served['server'].inference_url}/metrics", timeout=10).text
    for name in ("checked", "diverged", "dropped", "failed"):
        assert re.search(rf"^pipeline_shadow_{name}_total\{{{LABEL}\}} 0\.0$", text, re.M), text


def test_a_good_artifact_never_diverges(served: dict) -> None:
    server = served["server"]
    # In bursts below the reference's queue (QUEUE_SIZE, 32, in the runtime's
    # shadow.py), each accounted for before the next: on a loaded machine the reference
    # (nice 10) falls behind an unpaced client and the queue drops a share that depends
    # on the load (one full run: 54 of 200), which is not what this test is about.
    for first in range(0, 200, 20):
        _requests(server, 20, first=first)
        _counts(server, first + 20)
    got = _counts(server, 200)
    assert got["checked"] == 200 and got["dropped"] == 0 and got["failed"] == 0, got
    assert got["diverged"] == 0, got
    text = httpx.get(f"{server.inference_url}/metrics", timeout=10).text
    assert "pipeline_shadow_error_share_bucket" in text


def _weight(export_dir: Path) -> str:
    graph = onnx.load(str(export_dir / "model.onnx")).graph
    return max(graph.initializer, key=lambda t: int(np.prod(t.dims))).name


def test_an_artifact_altered_while_serving_diverges_after_a_restart(
    served: dict, tmp_path: Path
) -> None:
    server, export_dir = served["server"], served["export_dir"]
    before = _counts(server, 0, timeout_s=0)
    alter_onnx_initializer(export_dir, _weight(export_dir), lambda w: w * np.float32(1.5))
    rt = runtime.of(server)
    (killed,) = rt.worker_pids(server, DIGITS)
    os.kill(killed, signal.SIGKILL)  # the supervisor restarts it onto the altered file
    deadline = time.monotonic() + 60
    while rt.worker_pids(server, DIGITS) in ([], [killed]) or not _ready(server):
        assert time.monotonic() < deadline, "the workers were not replaced"
        time.sleep(0.2)
    _requests(server, 20)
    got = _counts(server, before["checked"] + before["dropped"] + 20)
    assert got["diverged"] - before["diverged"] >= 10, (before, got)
    log = (Path(server.run_dir) / "logs" / "kserve.out").read_text()
    assert re.search(r"WARNING .*shadow check: digits_lenet version 1 \(onnx\) diverged", log)
    assert "request id req-" in log
    kept = sorted((Path(server.run_dir) / "shadow").glob("*.json"))
    assert kept, "no divergent sample kept"
    about = json.loads(kept[-1].read_text())
    assert about["request_id"].startswith("req-") and "allowance" in about["what"]
    # The kept sample replays: verify on its inputs fails the altered ONNX file. Its report
    # goes beside the sample, not over the export's own parity.json (publish reads that).
    replay = about["replay"].split()[1:]  # drop "pipeline"
    report_path = Path(replay[replay.index("--report") + 1])
    assert report_path.parent == kept[-1].parent, replay
    proc = run_cli(*replay, "--batch-sizes", "1")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    failed = [r for r in report["rows"] if not r["passed"] and r["inputs"].startswith("file ")]
    assert failed, "the replay did not fail on the kept inputs"


def _ready(server: Server) -> bool:
    try:
        return httpx.get(f"{server.inference_url}/v2/health/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_artifact_altered_before_the_start_diverges(served: dict) -> None:
    stop(served["run_dir"])
    served["server"] = server = _serve(served["export_dir"], served["run_dir"])
    _requests(server, 10)
    got = _counts(server, 10)
    assert got["diverged"] >= 5, got


def test_the_rules_hold_each_answer_to_the_exports_own(
    exported: ExportResult, tmp_path: Path
) -> None:
    """In process: eager's own answer agrees (share well under 1); a perturbation past
    the manifest's tolerance diverges and is kept with its replay command."""
    x = digits_sample(1)
    with torch.inference_mode():
        from pipeline.export.opened import open_export

        eager = [t.numpy() for t in open_export(exported.out_dir).eager({"image": x}).values()]
    sample = Sample(DIGITS, 1, "onnx", str(exported.out_dir), {"image": x.numpy()}, eager)
    good = check(sample, {}, tmp_path)
    assert not good.diverged and good.share < 0.5
    bad = Sample(DIGITS, 1, "onnx", str(exported.out_dir), {"image": x.numpy()},
                 [eager[0] + 1e-2], request_id="r1")  # fmt: skip
    verdict = check(bad, {}, tmp_path)
    assert verdict.diverged and verdict.share > 1 and "allowance" in verdict.what
    assert (
        Path(verdict.kept).is_file()
        and "--inputs" in json.loads(Path(verdict.kept).with_suffix(".json").read_text())["replay"]
    )
