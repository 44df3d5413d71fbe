"""Who can manage a server `pipeline serve` started: only `pipeline serve` itself.

TorchServe 0.12 cannot close scaling: with `enable_model_api=false` it still
answers `PUT /models/<name>?min_worker=N` with 202 for the management key
(measured; only register and delete get 405). So the management key must
never reach an inference client: it stays in the owner-only `key_file.json`,
clients get `inference_key.json` with the inference key alone, and no key is
ever printed. One server, started and stopped through the CLI as a user runs
it, with two workers so that serve's own scaling path runs.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from pipeline.export import ExportResult
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive, archive_name
from pipeline.runtimes.torchserve.constants import KEY_FILE
from pipeline.runtimes.torchserve.management import management
from pipeline.serving.client import post, tensors_body
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.server import INFERENCE_KEY_FILE, ServeError, Server
from pipeline.zoo.data import digits_sample
from tests.conftest import run_cli

WORKERS = 2  # more than the archive's one, so that `pipeline serve` has to scale
MODEL = archive_name("digits_lenet", "torchscript")


@dataclass
class Served:
    server: Server
    output: str  # what `pipeline serve` printed, stdout and stderr
    keys: dict[str, str]  # every key TorchServe wrote, read before any test runs


@pytest.fixture(scope="module")
def served(exported: ExportResult, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    store = tmp_path_factory.mktemp("mgmt_store")
    archive(
        ArchiveConfig(
            model="digits_lenet", export_dir=exported.out_dir, store=store, formats=("torchscript",)
        )
    )
    run_dir = tmp_path_factory.mktemp("mgmt_run")
    keys: dict[str, str] = {}
    try:
        proc = run_cli(
            "serve",
            "--store", store,
            "--run-dir", run_dir,
            "--port", free_port(),
            "--management-port", free_port(),
            "--metrics-port", free_port(),
            "--workers-per-model", WORKERS,
            "--threads-per-worker", 1,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        data = json.loads((run_dir / KEY_FILE).read_text())
        keys = {kind: data[kind]["key"] for kind in ("inference", "management", "API")}
        yield Served(Server.load(run_dir), proc.stdout + proc.stderr, keys)
    finally:
        stopped = run_cli("stop", "--run-dir", run_dir)
        stop(run_dir)  # whatever the CLI left (it should be nothing)
    # `pipeline stop` is the last step of serve's own path: it stops the server,
    # removes both key files and prints no key.
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "stopped TorchServe" in stopped.stdout
    assert not any(k in stopped.stdout + stopped.stderr for k in keys.values())
    assert not (run_dir / KEY_FILE).exists()
    assert not (run_dir / INFERENCE_KEY_FILE).exists()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _worker_count(server: Server) -> tuple[int, int, int]:
    """(minWorkers, maxWorkers, workers) as TorchServe reports them."""
    body = management(server, "GET", f"/models/{MODEL}").json()[0]
    return body["minWorkers"], body["maxWorkers"], len(body["workers"])


def test_key_files_are_owner_only_and_clients_get_the_inference_key_alone(
    served: Served,
) -> None:
    run_dir = Path(served.server.run_dir)
    assert _mode(run_dir / KEY_FILE) == 0o600
    assert _mode(run_dir / INFERENCE_KEY_FILE) == 0o600
    public = json.loads((run_dir / INFERENCE_KEY_FILE).read_text())
    assert list(public) == ["inference"]
    assert public["inference"]["key"] == served.keys["inference"]
    text = (run_dir / INFERENCE_KEY_FILE).read_text()
    assert served.keys["management"] not in text and served.keys["API"] not in text
    # The client's file is enough to infer, through the gateway.
    resp = post(served.server, MODEL, tensors_body({"image": digits_sample(1)}))
    assert resp.status_code == 200, resp.text


def test_serve_prints_no_key(served: Served) -> None:
    assert "is up" in served.output
    assert INFERENCE_KEY_FILE in served.output  # where the client's token is, not the token
    for kind, key in served.keys.items():
        assert key not in served.output, f"`pipeline serve` printed the {kind} key"
    # Nor does any file serve writes beside the key files, logs included.
    run_dir = Path(served.server.run_dir)
    others = [
        p
        for p in run_dir.rglob("*")
        if p.is_file() and p.name not in {KEY_FILE, INFERENCE_KEY_FILE}
    ]
    assert any(p.name == "config.properties" for p in others)
    for path in others:
        text = path.read_text(errors="replace")
        for kind, key in served.keys.items():
            assert key not in text, f"{path} holds the {kind} key"


def test_serve_scaled_the_workers_as_configured(served: Served) -> None:
    assert _worker_count(served.server) == (WORKERS, WORKERS, WORKERS)
    # Serve's own credential still works: re-applying the same scale is accepted.
    resp = management(
        served.server,
        "PUT",
        f"/models/{MODEL}",
        params={"min_worker": WORKERS, "max_worker": WORKERS, "synchronous": "true"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    assert _worker_count(served.server) == (WORKERS, WORKERS, WORKERS)


# What an inference client might try: scale, register, unregister, switch the
# default version, list, and mint itself a management key.
ATTEMPTS = (
    ("PUT", f"/models/{MODEL}?min_worker=5&max_worker=5"),
    ("PUT", f"/models/{MODEL}?min_worker=0&max_worker=0"),
    ("POST", f"/models?url={MODEL}.mar&initial_workers=1"),
    ("DELETE", f"/models/{MODEL}"),
    ("PUT", f"/models/{MODEL}/1.0/set-default"),
    ("GET", "/models"),
    ("GET", "/token?type=management"),
)


@pytest.mark.parametrize("credential", ["none", "inference", "wrong"])
def test_an_inference_client_cannot_manage_the_server(served: Served, credential: str) -> None:
    server = served.server
    token = {"none": None, "inference": served.keys["inference"], "wrong": "not-a-key"}[credential]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # Every door: TorchServe's management API, its own inference API behind the
    # gateway (both loopback), and the gateway.
    for base in (
        server.extras["management_url"],
        server.extras["backend_url"],
        server.inference_url,
    ):
        for method, path in ATTEMPTS:
            resp = httpx.request(method, f"{base}{path}", headers=headers, timeout=30)
            assert 400 <= resp.status_code < 500, (base, method, path, resp.status_code)
    assert _worker_count(server) == (WORKERS, WORKERS, WORKERS)  # nothing moved
    assert (
        json.loads((Path(server.run_dir) / KEY_FILE).read_text())["management"]["key"]
        == (served.keys["management"])
    )


def test_a_client_without_the_private_file_gets_only_the_inference_key(
    served: Served, tmp_path: Path
) -> None:
    """What a client can read that was given inference_key.json and not key_file.json (the
    tests run as the owner, who can read both, so the client's view is a copy)."""
    (tmp_path / INFERENCE_KEY_FILE).write_bytes(
        (Path(served.server.run_dir) / INFERENCE_KEY_FILE).read_bytes()
    )
    keys = replace(served.server, run_dir=str(tmp_path)).keys()
    assert keys["inference"] == served.keys["inference"]
    with pytest.raises(ServeError, match="management"):
        keys["management"]
