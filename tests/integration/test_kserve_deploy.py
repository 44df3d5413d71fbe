"""`pipeline deploy kserve` end to end: the folder it writes validates against KServe's
schema, and its TorchServe layout, started the way KServe's torchserve runtime starts
it, answers an Open Inference Protocol v2 request with the eager result."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from pipeline.export import ExportConfig, ExportResult, export
from pipeline.export.opened import open_export
from pipeline.runtimes.kserve.deploy import DeployError, deploy_kserve
from pipeline.runtimes.kserve.manifests import TORCHSERVE_ARGS, DeployConfig
from pipeline.runtimes.kserve.validate import check, iter_documents
from pipeline.runtimes.torchserve.properties import parse as parse_properties
from pipeline.serving import runtime
from pipeline.serving.launcher import free_port
from pipeline.train import TrainResult


@pytest.fixture(scope="module")
def ts_export(trained: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    out_dir = tmp_path_factory.mktemp("kserve_export") / "export"
    return export(
        ExportConfig(checkpoint=trained.checkpoint.path, out_dir=out_dir, formats=("torchscript",))
    )


@pytest.fixture(scope="module")
def deployed(ts_export: ExportResult, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("kserve_deploy") / "out"
    return deploy_kserve(DeployConfig(model="digits_lenet", export_dir=ts_export.out_dir, out=out))


def test_deploy_writes_valid_manifests(deployed) -> None:
    out = deployed.out
    yamls = sorted(out.glob("*.yaml")) + sorted((out / "torchserve").glob("*.yaml"))
    assert [p.relative_to(out).as_posix() for p in yamls] == [
        "inferenceservice-gpu.yaml",
        "inferenceservice.yaml",
        "torchserve/inferenceservice.yaml",
    ]
    for path in yamls:
        (doc,) = iter_documents(path.read_text())
        check(doc, what=str(path))
    assert (out / "export" / "manifest.json").is_file()
    # The image's runtime opens the TorchScript export with its eager model: the folder
    # carries the checkpoint (it had none, and every such image stopped at start).
    assert open_export(out / "export").checkpoint == out / "export" / "checkpoint.pt"
    assert (out / "src" / "pipeline" / "runtimes" / "kserve" / "config.py").is_file()
    assert (out / "torchserve" / "model-store" / "digits_lenet_ts.mar").is_file()
    rc = json.loads((out / "kserve.json").read_text())
    assert rc["host"] == "0.0.0.0" and rc["models"][0]["export_dir"] == "/srv/export"


def test_the_image_s_unprivileged_user_can_read_the_export(
    ts_export: ExportResult, deployed
) -> None:
    """The Dockerfile COPYs export/ and then runs as uid 1000; COPY keeps modes, and the
    export folder was mkdtemp's 0700 (the runtime then failed: "Permission denied:
    /srv/export/publish.json"). The export is made readable, and so is its copy."""
    assert ts_export.out_dir.stat().st_mode & 0o777 == 0o777 & ~_umask()
    for path in [deployed.out / "export", *(deployed.out / "export").rglob("*")]:
        wanted = 0o755 if path.is_dir() else 0o644
        assert path.stat().st_mode & wanted == wanted, (path, oct(path.stat().st_mode))
    assert "USER 1000" in (deployed.out / "Dockerfile").read_text()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_without_a_pytorch_runtime_only_the_projects_runtime_is_written(
    ts_export: ExportResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TorchServe layout comes from the registry's runtime for KServe's `pytorch`
    format; with none, the folder holds the project's runtime alone and says nothing of
    TorchServe."""
    monkeypatch.setattr(runtime.get("torchserve"), "packaging", None)
    got = deploy_kserve(
        DeployConfig(model="digits_lenet", export_dir=ts_export.out_dir, out=tmp_path / "out")
    )
    assert got.mar is None and got.torchserve_name is None
    assert not (got.out / "torchserve").exists()
    assert (got.out / "inferenceservice.yaml").is_file()
    assert "TorchServe" not in (got.out / "README.md").read_text()


def test_deploy_refuses_a_format_the_export_lacks(ts_export: ExportResult, tmp_path: Path) -> None:
    config = DeployConfig(
        model="digits_lenet", export_dir=ts_export.out_dir, out=tmp_path / "o", format="onnx"
    )
    with pytest.raises(DeployError, match="no onnx artifact"):
        deploy_kserve(config)
    assert not (tmp_path / "o").exists()


def _local_properties(text: str, port: int, model_store: Path) -> str:
    """The generated config with only the addresses (and the store path) made local."""
    props = parse_properties(text)
    props["inference_address"] = props["management_address"] = f"http://127.0.0.1:{port}"
    props["metrics_address"] = f"http://127.0.0.1:{free_port()}"
    props["grpc_inference_port"] = str(free_port())
    props["grpc_management_port"] = str(free_port())
    props["grpc_inference_address"] = props["grpc_management_address"] = "127.0.0.1"
    props["model_store"] = str(model_store)
    assert props["allowed_urls"] == "file:///mnt/models/model-store/[^/]+[.]mar"
    props["allowed_urls"] = f"file://{model_store}/[^/]+[.]mar"
    return "".join(f"{k}={v}\n" for k, v in props.items())


def test_torchserve_layout_answers_open_inference_protocol(
    deployed, ts_export: ExportResult, tmp_path: Path
) -> None:
    layout = deployed.out / "torchserve"
    store = layout / "model-store"
    port = free_port()
    conf = tmp_path / "config.properties"
    conf.write_text(
        _local_properties((layout / "config" / "config.properties").read_text(), port, store)
    )
    for d in ("tmp", "logs"):
        (tmp_path / d).mkdir()
    # enable_envvars_config is off in the layout, but keep the host's TS_* out regardless.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TS_")}
    env.update(TMPDIR=str(tmp_path / "tmp"), LOG_LOCATION=str(tmp_path / "logs"),
               METRICS_LOCATION=str(tmp_path / "logs"), OMP_NUM_THREADS="1")  # fmt: skip
    # As KServe's kserve-torchserve ServingRuntime starts it (config/runtimes/kserve-torchserve.yaml),
    # plus the manifest's args; --foreground so the process is ours to stop.
    cmd = [
        str(Path(sys.executable).parent / "torchserve"), "--start", "--foreground",
        f"--model-store={store}", f"--ts-config={conf}", *TORCHSERVE_ARGS, "--ncs",
    ]  # fmt: skip
    log = (tmp_path / "torchserve.out").open("wb")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    name = deployed.torchserve_name
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "torchserve.out").read_text()[-3000:]
            try:
                r = httpx.get(f"{base}/models/{name}", timeout=2)  # management on the same port
                if r.status_code == 200 and r.json()[0]["workers"][0]["status"] == "READY":
                    break
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                pass
            assert time.monotonic() < deadline, "TorchServe did not get the model READY in 120 s"
            time.sleep(0.5)
        x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
        body = {
            "id": "req-1",
            "inputs": [
                {"name": "image", "shape": list(x.shape), "datatype": "FP32",
                 "data": x.reshape(-1).tolist()}
            ],
        }  # fmt: skip
        r = httpx.post(f"{base}/v2/models/{name}/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text[:2000]
        # No token on the pod's management API: an archive from elsewhere is refused.
        remote = f"http://127.0.0.1:{free_port()}/evil.mar"
        refused = httpx.post(f"{base}/models", params={"url": remote}, timeout=30)
        assert refused.status_code == 404, refused.text
        assert "does not match any allowed URL" in refused.text, refused.text
        answer = r.json()
        assert answer["model_name"] == name
        (out,) = answer["outputs"]
        assert (out["name"], out["datatype"], out["shape"]) == ("logits", "FP32", [2, 10])
        got = torch.tensor(out["data"]).reshape(out["shape"])
        eager = open_export(ts_export.out_dir).model
        with torch.no_grad():
            want = eager(x)
        tol = json.loads((ts_export.out_dir / "manifest.json").read_text())["tolerance"]
        torch.testing.assert_close(got, want, atol=tol["atol"], rtol=tol["rtol"])
    finally:
        _stop_group(proc)
        log.close()
    leftovers = subprocess.run(
        ["pgrep", "-f", re.escape(str(conf))], capture_output=True, text=True
    ).stdout.split()
    assert leftovers == [], f"processes left running: {leftovers}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM TorchServe's process group (the launcher and its Java frontend and
    workers); SIGKILL what is still there after 30 s."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if not _group_alive(proc.pid):
            break
        os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            proc.poll()  # reap the launcher so the group can empty
            time.sleep(0.2)
    proc.wait(10)
