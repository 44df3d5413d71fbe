"""Versions on a running TorchServe: a real TorchServe started with --live-versions takes
a published version through its management API, the gateway moves traffic, and a load
run across canary, promote and rollback loses nothing. The store is unsigned and has no
trust policy: archive and serve use it as before, with one warning."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pipeline.cli import main
from pipeline.runtimes.torchserve.archive import settings_of
from pipeline.runtimes.torchserve.launch import store_archives
from pipeline.runtimes.torchserve.liveops import live_state
from pipeline.runtimes.torchserve.management import management
from pipeline.runtimes.torchserve.store import archive_version, follow_defaults
from pipeline.serving import runtime, versions
from pipeline.serving.client import auth_headers
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.live import VERSION_HEADER
from pipeline.serving.rollout import RolloutConfig, rollback, rollout
from pipeline.serving.server import Server
from tests.load_span import LoadSpan, as_canary

MODEL = "digits_lenet"
ARCHIVE = "digits_lenet_onnx"
SAID: list[str] = []  # what the fixtures' archive and serve printed on stderr


@pytest.fixture(scope="module")
def store(two_versions: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    mine = tmp_path_factory.mktemp("ts-rollout") / "store"
    shutil.copytree(two_versions, mine)
    # A published model is archived at its default version, numbered as such.
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["archive", "--model", MODEL, "--store", str(mine), "--format", "onnx"]) == 0
    SAID.append(err.getvalue())
    return mine


@pytest.fixture(scope="module")
def served(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("ts-rollout-run") / "run"
    # What an earlier start left in the workers' TMPDIR (each .pt2 load unpacked ~2.5 MB).
    (run_dir / "tmp" / "aotinductor_earlier").mkdir(parents=True)
    argv = [
        "serve", "--model", MODEL, "--store", str(store), "--run-dir", str(run_dir),
        "--live-versions", "--port", str(free_port()), "--management-port", str(free_port()),
        "--metrics-port", str(free_port()), "--workers-per-model", "2",
    ]  # fmt: skip
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(argv) == 0
    SAID.append(err.getvalue())
    try:
        yield Server.load(run_dir)
    finally:
        stop(run_dir)


def test_an_unsigned_store_without_a_policy_serves_with_one_warning(served: Server) -> None:
    said = "".join(SAID)
    assert said.count("has no trust policy") == 1, said  # archive and serve: one warning
    health = httpx.get(f"{served.inference_url}/ping", timeout=10)
    assert health.status_code == 200
    assert not (Path(served.run_dir) / "tmp" / "aotinductor_earlier").exists()  # cleared


def _workers(server: Server, version: int) -> int:
    answer = management(server, "GET", f"/models/{ARCHIVE}/{version}")
    return len(answer.json()[0]["workers"])


def _registered(server: Server) -> list[str]:
    """The versions TorchServe itself holds for the archive."""
    answer = management(server, "GET", f"/models/{ARCHIVE}/all")
    return sorted(str(m["modelVersion"]) for m in answer.json())


def test_canary_promote_and_rollback_on_torchserve_lose_nothing(
    served: Server, store: Path
) -> None:
    assert live_state(served).models[ARCHIVE].default == 1  # the archive says version 1
    run_dir = Path(served.run_dir)
    # The gateway names the answering version from the first request (it named none
    # until a rollout wrote the live state: loadtest --by-version counted them as None).
    first = httpx.post(
        f"{served.inference_url}/predictions/{MODEL}", json={"inputs": [[[0.0] * 28] * 28]},
        headers=auth_headers(served, "inference"), timeout=30,
    )  # fmt: skip
    assert first.status_code == 200 and first.headers.get(VERSION_HEADER) == "1", first.headers
    unknown = httpx.post(
        f"{served.inference_url}/predictions/{MODEL}/9", json={"inputs": [[[0.0] * 28] * 28]},
        headers=auth_headers(served, "inference"), timeout=30,
    )  # fmt: skip
    assert unknown.status_code == 404 and VERSION_HEADER not in unknown.headers  # none answered
    # TorchServe's copy of version 2 kept by an earlier server (promoted, then stopped):
    # registering it again failed, "Model file already exists digits_lenet_onnx.v2.mar".
    shutil.copy(store / f"{ARCHIVE}.mar", store / f"{ARCHIVE}.v2.mar")
    with LoadSpan(served, store) as load:
        rollout(
            as_canary(run_dir, store, 20, 1.0),
            say=lambda _: None,
        )
        assert _registered(served) == ["1", "2"]
        # As many workers as the default's (the archive's model-config capped them at 1).
        assert _workers(served, 2) == _workers(served, 1) == 2
        url = f"{served.inference_url}/predictions/{MODEL}/2"
        answer = httpx.post(
            url, json={"inputs": [[[0.0] * 28] * 28]},
            headers=auth_headers(served, "inference"), timeout=30,
        )  # fmt: skip
        assert answer.status_code == 200 and answer.headers[VERSION_HEADER] == "2"
        rollout(RolloutConfig(MODEL, run_dir, promote=True, store=store), say=lambda _: None)
        assert _registered(served) == ["2"] and versions.read_pointer(MODEL, store).default == 2
        assert rollback(MODEL, run_dir, store, say=lambda _: None) == 1
    load.check_nothing_lost()
    answered = load.answered()
    assert answered.get("1", 0) > 0 and answered.get("2", 0) > 0, answered
    assert _registered(served) == ["1"]
    assert _workers(served, 1) == 2  # registered again by the rollback: scaled too
    assert runtime.get("torchserve").versions.live_state(served).models[
        ARCHIVE
    ].versions.keys() == {1}
    # The rollback registered version 1 from its store folder: TorchServe's copy of it
    # is no archive a later `pipeline serve` starts beside the original.
    assert sorted(p.name for p in store.glob("*.mar")) == [f"{ARCHIVE}.mar", f"{ARCHIVE}.v1.mar"]
    assert store_archives(store) == [ARCHIVE]


def test_without_live_versions_a_rollout_says_what_to_do(tmp_path: Path) -> None:
    record = Server(
        runtime="torchserve", pid=0, run_dir=str(tmp_path), inference_url="http://127.0.0.1:1",
        metrics_url="http://127.0.0.1:1", models=[ARCHIVE], started=0.0,
    )  # fmt: skip
    assert live_state(record) is None  # rollout then names the runtime and what to restart


def test_serve_follows_the_default_pointer_keeping_the_archive_settings(
    store: Path, tmp_path: Path
) -> None:
    """After a rollout moved the pointer, the next `pipeline serve` serves the default:
    the archive is built again from that version, with the settings it had."""
    mine = tmp_path / "store"
    shutil.copytree(store, mine)
    mar = mine / f"{ARCHIVE}.mar"
    before = settings_of(mar)
    assert archive_version(mar) == "1" and before["batch_size"] == 8
    assert follow_defaults(mine, store_archives(mine)) == []  # already the default
    versions.set_default(MODEL, 2, mine)
    assert follow_defaults(mine, store_archives(mine)) == [ARCHIVE]
    assert archive_version(mar) == "2" and settings_of(mar) == before
