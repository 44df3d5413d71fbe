"""Versions on a running KServe runtime: two checkpoints trained with different seeds,
published (`two_versions`), version 1 served on two workers, and move between them under load with nothing
lost - every answer checked against eager of the version that gave it.

One server for the module (`served`); each test starts from version 1 alone
(`_reset`) and a load run in a thread (`_Load`) spans whatever the test does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as thttp

from pipeline.cli import main
from pipeline.core import signing
from pipeline.core.errors import PipelineError
from pipeline.serving import live, runtime, versions
from pipeline.serving import rollout as rollout_module
from pipeline.serving.client import auth_headers
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.rollout import (
    Bounds,
    RolledBackError,
    RolloutConfig,
    RolloutRefusedError,
    rollback,
    rollout,
)
from pipeline.serving.server import Server
from tests.load_span import LoadSpan, as_canary
from tests.tamper import alter_onnx_initializer

MODEL = "digits_lenet"


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The publisher's private key (its public key is the store's trust policy)."""
    private = tmp_path_factory.mktemp("publisher") / "publisher.key"
    signing.keygen(private)
    return private


@pytest.fixture(scope="module")
def store(two_versions: Path, key: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Versions 1 and 2 (seeds 0 and 1), this module's own copy, signed by the publisher,
    whose public key is in the store's trust/: every version served here is checked."""
    mine = tmp_path_factory.mktemp("rollout") / "store"
    shutil.copytree(two_versions, mine)
    for v in versions.versions(MODEL, mine):
        signing.sign(v.dir, key)
    (mine / signing.TRUST_FOLDER).mkdir()
    shutil.copy2(key.with_suffix(".pub"), mine / signing.TRUST_FOLDER / "publisher.pub")
    return mine


@pytest.fixture(scope="module")
def served(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("rollout-run") / "run"
    argv = [
        "serve", "--runtime", "kserve", "--model", MODEL, "--store", str(store),
        "--run-dir", str(run_dir), "--port", str(free_port()), "--grpc-port", str(free_port()),
        "--workers", "2", "--threads-per-worker", "1",
    ]  # fmt: skip
    assert main(argv) == 0
    try:
        yield Server.load(run_dir)
    finally:
        stop(run_dir)


def _reset(server: Server, store: Path) -> None:
    """Version 1 alone and the store's pointer back on it."""
    rt = runtime.get("kserve")
    state = rt.versions.live_state(server)
    v1 = versions.get(MODEL, 1, store)
    alone = live.ModelVersions({1: live.Loaded(1, str(v1.dir), "onnx")}, 1)
    rt.versions.apply_live(server, live.LiveState(state.generation + 1, {MODEL: alone}), 120)
    versions.write_pointer(MODEL, versions.Pointer(1, []), store)


def _served_sha(run_dir: Path) -> str:
    return Server.load(run_dir).served[MODEL].sha256


def _onnx_sha(store: Path, number: int) -> str:
    return versions.get(MODEL, number, store).open().manifest.artifact("onnx").sha256


def test_the_versions_differ_so_the_checks_by_version_can_fail(store: Path) -> None:
    one, two = (versions.get(MODEL, n, store).open() for n in (1, 2))
    x = one.sample(4, seed=3)
    (a,), (b,) = one.eager(x).values(), two.eager(x).values()
    assert (a - b).abs().max() > 100 * one.manifest.tolerance.atol


def test_canary_promote_and_rollback_under_load_lose_nothing(served: Server, store: Path) -> None:
    _reset(served, store)
    run_dir = Path(served.run_dir)
    said: list[str] = []
    with LoadSpan(served, store) as load:
        state = rollout(as_canary(run_dir, store, 20, 1.0), say=said.append)
        # The hints carry this server's folders: without them they act on the defaults'.
        hint = next(s for s in said if s.startswith("promote with"))
        assert f"--promote --run-dir {run_dir} --store {store}`" in hint, hint
        assert (state.models[MODEL].canary, state.models[MODEL].percent) == (2, 20.0)
        assert versions.read_pointer(MODEL, store).default == 1  # a canary moves no pointer
        time.sleep(1.0)
        tallies = runtime.get("kserve").versions.live_stats(served)
        canary, default = tallies[MODEL, 2].requests, tallies[MODEL, 1].requests
        assert 0 < canary < default, (canary, default)  # its share of unversioned requests
        rollout(RolloutConfig(MODEL, run_dir, promote=True, store=store), say=lambda _: None)
        assert versions.read_pointer(MODEL, store).default == 2
        # server.json says what answers now: infer compares a local export with it.
        assert _served_sha(run_dir) == _onnx_sha(store, 2)
        time.sleep(1.0)
        assert rollback(MODEL, run_dir, store, say=lambda _: None) == 1
        assert _served_sha(run_dir) == _onnx_sha(store, 1)
        time.sleep(1.0)
    load.check_nothing_lost()
    answered = load.answered()
    assert answered.get("1", 0) > 0 and answered.get("2", 0) > 0, answered
    assert versions.read_pointer(MODEL, store) == versions.Pointer(1, [])
    state = runtime.get("kserve").versions.live_state(served)
    assert sorted(state.models[MODEL].versions) == [1]  # version 2 was unloaded


def test_a_canary_without_answers_is_not_promoted(served: Server, store: Path) -> None:
    """A watch with no traffic said "canary 0 answers" and exited 0, and --promote then made
    the unjudged version the default (--min-requests was never enforced)."""
    _reset(served, store)
    run_dir = Path(served.run_dir)
    said: list[str] = []
    rollout(as_canary(run_dir, store, 20, 0.0), say=said.append)
    assert any(s.startswith("not judged yet: ") and "answered 0 of the 20" in s for s in said)
    with pytest.raises(PipelineError, match=r"Not promoted: .*answered 0 of the 20 requests"):
        rollout(RolloutConfig(MODEL, run_dir, promote=True, store=store), say=lambda _: None)
    mv = runtime.get("kserve").versions.live_state(served).models[MODEL]
    assert (mv.default, mv.canary) == (1, 2) and versions.read_pointer(MODEL, store).default == 1
    unjudged = RolloutConfig(
        MODEL, run_dir, promote=True, store=store, bounds=Bounds(min_requests=0)
    )
    rollout(unjudged, say=lambda _: None)  # asked for: promoted
    assert versions.read_pointer(MODEL, store).default == 2
    _reset(served, store)


def test_a_canary_past_its_bound_rolls_back_by_itself(served: Server, store: Path) -> None:
    _reset(served, store)
    tight = Bounds(max_error_rate=0.01, max_p99_ratio=1e-6, min_requests=5)
    breach = pytest.raises(RolledBackError, match=r"p99 .* is over --max-p99-ratio 1e-06")
    with LoadSpan(served, store) as load, breach:
        rollout(
            RolloutConfig(MODEL, Path(served.run_dir), version=2, store=store, canary=50,
                          watch_s=30.0, bounds=tight),
            say=lambda _: None,
        )  # fmt: skip
    load.check_nothing_lost()
    mv = runtime.get("kserve").versions.live_state(served).models[MODEL]
    assert (mv.default, mv.canary, sorted(mv.versions)) == (1, None, [1])


def test_a_wrong_version_is_refused_by_the_live_check(
    served: Server, store: Path, key: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _reset(served, store)
    rollout(RolloutConfig(MODEL, Path(served.run_dir), version=2, store=store), say=lambda _: None)
    v2 = versions.get(MODEL, 2, store)
    # A broken exporter's output (one weight ×1.5, the manifest resealed), signed by the
    # publisher who did not know: the signature holds, the numbers do not.
    broken = tmp_path / "broken"
    shutil.copytree(v2.dir, broken)
    alter_onnx_initializer(broken, "classifier.8.weight", lambda w: w * np.float32(1.5))
    published = versions.publish(
        MODEL, broken, broken / versions.REPORT, broken / versions.CHECKPOINT, store, sign=key
    )
    bad = published.version
    argv = ["rollout", "--model", MODEL, "--version", str(bad.number), "--store", str(store),
            "--run-dir", served.run_dir]  # fmt: skip
    with LoadSpan(served, store) as load:
        assert main(argv) == 1
    load.check_nothing_lost()
    err = capsys.readouterr().err
    assert (
        f"Version {bad.number} failed the live check" in err and "version 2) keeps serving" in err
    )
    assert "kserve/rest/onnx@3" in err  # where: the version's own route
    # No in-process backend ran in the live check: the file as it is now in the store was
    # run in process, and the report blames it, not the runtime or the transport.
    assert f"the onnx artifact itself differs from eager: {bad.dir / 'model.onnx'}" in err, err
    assert "classifier.8" in err and "runtime or transport" not in err, err
    # The live check's report says who signed what it checked.
    report = Path(served.run_dir) / live.FOLDER / f"check-{MODEL}-{bad.number}.json"
    signed = json.loads(report.read_text())["signature"]
    assert signed["state"] == signing.SIGNED and signed["signer"].startswith("publisher ("), signed
    mv = runtime.get("kserve").versions.live_state(served).models[MODEL]
    assert (mv.default, sorted(mv.versions)) == (2, [2])
    shutil.rmtree(bad.dir)  # the other tests know versions 1 and 2


def test_a_version_published_signed_rolls_out_and_serves(
    served: Server, store: Path, key: Path
) -> None:
    _reset(served, store)
    # serve recorded its store: rollout, rollback and status without --store use it.
    assert served.extras["store"] == str(store.resolve())
    v2 = versions.get(MODEL, 2, store)
    signed = versions.publish(
        MODEL, v2.dir, v2.dir / versions.REPORT, v2.checkpoint, store, sign=key
    )
    assert signed.signer == signing.signer_of(signed.version.dir)
    new = signed.version.number
    rollout(
        RolloutConfig(MODEL, Path(served.run_dir), version=new, store=store), say=lambda _: None
    )
    x = signed.version.open().sample(1, seed=2)
    want = signed.version.open().eager(x)["logits"]
    url = f"{served.inference_url}/v2/models/{MODEL}/infer"
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(x["image"].shape),
                        "data": x["image"].flatten().tolist()}]}  # fmt: skip
    got = httpx.post(url, json=body, headers=auth_headers(served, "inference"), timeout=30)
    assert got.status_code == 200 and got.json()["model_version"] == str(new), got.text
    answer = np.array(got.json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(answer, want.flatten().numpy(), atol=1e-4)
    _reset(served, store)
    shutil.rmtree(signed.version.dir)


def _refused(served: Server, store: Path, number: int, capsys: pytest.CaptureFixture[str]) -> str:
    """`pipeline rollout --version NUMBER` refused before anything is loaded; its stderr."""
    argv = ["rollout", "--model", MODEL, "--version", str(number), "--store", str(store),
            "--run-dir", served.run_dir]  # fmt: skip
    assert main(argv) == 1
    mv = runtime.get("kserve").versions.live_state(served).models[MODEL]
    assert (mv.default, sorted(mv.versions)) == (1, [1])  # nothing was loaded
    return capsys.readouterr().err


def test_a_signed_version_changed_after_signing_is_refused_naming_the_file(
    served: Server, store: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _reset(served, store)
    v2 = versions.get(MODEL, 2, store)
    bad = versions.publish(
        MODEL, v2.dir, v2.dir / versions.REPORT, v2.checkpoint, store, sign=key
    ).version
    alter_onnx_initializer(bad.dir, "classifier.8.weight", lambda w: w * np.float32(1.5))
    err = _refused(served, store, bad.number, capsys)
    assert f"the version in {bad.dir} changed since it was signed" in err, err
    assert "model.onnx differs from the signed bytes" in err, err
    shutil.rmtree(bad.dir)


def test_a_version_signed_by_an_untrusted_key_is_refused(
    served: Server, store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _reset(served, store)
    other = tmp_path / "someone-else.key"
    signing.keygen(other)
    v2 = versions.get(MODEL, 2, store)
    bad = versions.publish(
        MODEL, v2.dir, v2.dir / versions.REPORT, v2.checkpoint, store, sign=other
    ).version
    err = _refused(served, store, bad.number, capsys)
    assert "is signed by key" in err and "not in the trust policy (" in err, err
    shutil.rmtree(bad.dir)


def test_publishing_an_unsigned_version_under_a_trust_policy_is_warned_of_at_once(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store with a trust policy took an unsigned version silently; the rollout refused
    it later (a user's trial, 2026-11-28). And the printed rollout hint names the store."""
    mine = tmp_path / "store"
    shutil.copytree(store, mine)
    v1 = versions.get(MODEL, 1, mine)
    argv = ["publish", "--model", MODEL, "--export-dir", str(v1.dir), "--report",
            str(v1.dir / versions.REPORT), "--checkpoint", str(v1.checkpoint), "--store", str(mine)]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "has a trust policy" in err and "this version is not signed" in err, err
    assert f"--version 3 --store {mine}`" in out, out
    # Version 1's files again: two identical versions were made without a word.
    assert f"note: version 1 of {MODEL} already holds these artifacts" in out, out
    assert "version 2 of" not in out, out


def test_a_rollback_whose_version_does_not_load_leaves_the_live_state_as_it_was(
    served: Server, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 1's file changes after the rollback checked it (or a store without a trust
    policy, where nothing checks it before the workers do): the workers refuse it, and the
    live state must not keep it, or the next worker the supervisor restarts would load it,
    fail, and after three deaths take the server down."""
    _reset(served, store)
    rollout(RolloutConfig(MODEL, Path(served.run_dir), version=2, store=store), say=lambda _: None)
    onnx_file = versions.get(MODEL, 1, store).dir / "model.onnx"
    kept = onnx_file.read_bytes()
    monkeypatch.setattr(rollout_module, "_trusted", lambda *_: None)  # changed after the check
    onnx_file.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    try:
        with pytest.raises(RolloutRefusedError, match="Version 1 did not load"):
            rollback(MODEL, Path(served.run_dir), store, say=lambda _: None)
        mv = runtime.get("kserve").versions.live_state(served).models[MODEL]
        assert (mv.default, sorted(mv.versions)) == (2, [2])
        assert versions.read_pointer(MODEL, store).default == 2
    finally:
        onnx_file.write_bytes(kept)
    _reset(served, store)


def test_a_key_added_to_trust_after_serve_started_does_not_count_in_its_workers(
    served: Server, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can write to the store signs a version with their own key and adds that key
    to trust/: the server trusts at most the keys trust/ held as `serve` started
    (signing.pins, in server.json and each worker's config), so the rollout refuses it,
    and so do the workers (the rollout's own check bypassed): version 1 keeps serving.
    Before, both read trust/ afresh: the key counted (and a deleted trust/ turned a
    worker's check off)."""
    _reset(served, store)
    mallory = tmp_path / "mallory.key"
    signing.keygen(mallory)
    v2 = versions.get(MODEL, 2, store)
    signed = versions.publish(
        MODEL, v2.dir, v2.dir / versions.REPORT, v2.checkpoint, store, sign=mallory
    )
    added = store / signing.TRUST_FOLDER / "mallory.pub"
    shutil.copy2(mallory.with_suffix(".pub"), added)
    number = signed.version.number
    config = RolloutConfig(MODEL, Path(served.run_dir), version=number, store=store)
    try:
        with pytest.raises(signing.SignatureError, match=r"1 of the 1 key\(s\) `serve` started"):
            rollout(config, say=lambda _: None)
        monkeypatch.setattr(rollout_module, "_trusted", lambda *_: None)  # the workers' own
        with pytest.raises(RolloutRefusedError, match=f"Version {number} did not load"):
            rollout(config, say=lambda _: None)
        mv = runtime.get("kserve").versions.live_state(served).models[MODEL]
        assert (mv.default, sorted(mv.versions)) == (1, [1])
    finally:
        added.unlink()
        _reset(served, store)
        shutil.rmtree(signed.version.dir)


def _triton_grpc(server: Server, *args: str | Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.triton_grpc", args[0], server.extras["grpc_url"],
         server.keys()["inference"], *map(str, args[1:])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_tritonclient_sees_the_versions_and_asks_one_by_name(
    served: Server, store: Path, tmp_path: Path
) -> None:
    _reset(served, store)
    rollout(
        as_canary(Path(served.run_dir), store, 10, 0),
        say=lambda _: None,
    )
    x = versions.get(MODEL, 1, store).open().sample(1, seed=5)["image"].numpy()
    want = {
        n: versions.get(MODEL, n, store).open().eager({"image": torch.from_numpy(x)})
        for n in (1, 2)
    }
    hostport = served.inference_url.removeprefix("http://")
    client = thttp.InferenceServerClient(hostport)
    try:
        headers = auth_headers(served, "inference")
        meta = client.get_model_metadata(MODEL, headers=headers)
        assert meta["versions"] == ["1", "2"]
        assert client.get_model_metadata(MODEL, "2", headers=headers)["versions"] == ["1", "2"]
        assert client.is_model_ready(MODEL, "2", headers=headers)
        tensor = thttp.InferInput("image", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        for n in (1, 2):
            got = client.infer(MODEL, [tensor], model_version=str(n), headers=headers)
            assert got.get_response()["model_version"] == str(n)
            np.testing.assert_allclose(got.as_numpy("logits"), want[n]["logits"], atol=1e-4)
    finally:
        client.close()
    np.save(tmp_path / "x.npy", x)
    said = _triton_grpc(served, "infer", MODEL, "image", tmp_path / "x.npy", "logits",
                        tmp_path / "y.npy", "2")  # fmt: skip
    assert said["model_version"] == "2"
    # A version not loaded: NOT_FOUND, as REST's 404 (it was INVALID_ARGUMENT).
    said = _triton_grpc(served, "infer", MODEL, "image", tmp_path / "x.npy", "logits",
                        tmp_path / "y9.npy", "9")  # fmt: skip
    assert said["error"] == "StatusCode.NOT_FOUND" and "has no version '9'" in said["message"]
    found = _triton_grpc(served, "describe", MODEL, f"{MODEL}@2", f"{MODEL}@9")["models"]
    assert found[MODEL]["metadata"]["versions"] == ["1", "2"] and found[MODEL]["ready"]
    assert found[f"{MODEL}@2"]["ready"] and "error" in found[f"{MODEL}@9"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want[2]["logits"], atol=1e-4)


def test_a_restarted_worker_serves_the_rolled_out_versions(served: Server, store: Path) -> None:
    _reset(served, store)
    rollout(
        as_canary(Path(served.run_dir), store, 10, 0),
        say=lambda _: None,
    )
    rt = runtime.get("kserve")
    before = rt.worker_pids(served, MODEL)
    os.kill(before[0], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = rt.worker_pids(served, MODEL)
        if len(now) == len(before) and before[0] not in now:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the supervisor did not replace the killed worker")
    ready = f"{served.inference_url}/v2/health/ready"
    with contextlib.suppress(httpx.HTTPError):
        while httpx.get(ready, timeout=2).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
    url = f"{served.inference_url}/v2/models/{MODEL}/versions/2/infer"
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28],
                        "data": [0.0] * 784}]}  # fmt: skip
    for _ in range(20):  # a new connection each time: both workers get some
        r = httpx.post(url, json=body, headers=auth_headers(served, "inference"), timeout=30)
        assert r.status_code == 200 and r.json()["model_version"] == "2", r.text


def test_no_network_route_changes_versions(served: Server, store: Path) -> None:
    """The control channel is the run folder: the inference token reaches no load/unload."""
    _reset(served, store)
    headers = auth_headers(served, "inference")
    for path in (f"/v2/repository/models/{MODEL}/unload", f"/v2/repository/models/{MODEL}/load"):
        r = httpx.post(served.inference_url + path, headers=headers, timeout=10)
        assert r.status_code == 404 and "No such route" in r.json()["error"], r.text
    r = httpx.get(f"{served.inference_url}/v2/models/{MODEL}/versions/2", headers=headers)
    assert r.status_code == 404 and "has no version '2'" in r.json()["error"]
    assert runtime.get("kserve").versions.live_state(served).models[MODEL].default == 1


def test_torchserve_archives_of_a_signed_version_hold_its_bytes_and_keep_it_signed(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The signature covers the version folder; TorchServe loads a .mar built from it. Under
    the trust policy `pipeline serve` (follow_defaults) ties the two: an archive whose
    model, handler or runtime code is not what archiving the signed version gives is made
    again from it, so the changed bytes never load."""
    from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
    from pipeline.runtimes.torchserve.signed import differences
    from pipeline.runtimes.torchserve.store import follow_defaults

    mine = tmp_path / "store"
    shutil.copytree(store, mine)
    default = versions.default(MODEL, mine)
    (mar,) = archive(
        ArchiveConfig(model=MODEL, export_dir=default.dir, store=mine, formats=("onnx",),
                      version=str(default.number))
    )  # fmt: skip
    assert differences(mar, default.dir, "onnx") == []
    # One bit of the model flipped, and a module of the attacker's beside the handler.
    changed = tmp_path / "changed.mar"
    with zipfile.ZipFile(mar) as src, zipfile.ZipFile(changed, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "model.onnx":
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.writestr(item, data)
        dst.writestr("onnxruntime.py", "raise SystemExit('not yours')\n")
    changed_bytes = changed.read_bytes()
    changed.replace(mar)
    assert differences(mar, default.dir, "onnx") == [
        "model.onnx differs",
        "onnxruntime.py is not a file archive packs",
    ]
    capsys.readouterr()
    assert follow_defaults(mine, [mar.stem]) == [mar.stem]
    err = capsys.readouterr().err
    assert f"is not what archiving signed version {default.number}" in err, err
    assert "model.onnx differs" in err and "archived again from it" in err, err
    assert differences(mar, default.dir, "onnx") == []
    assert follow_defaults(mine, [mar.stem]) == []  # as archived: left alone

    # A rollout builds the version's archive outside its folder, so the signature still
    # holds after it (it counted the archive as a file added since signing), and a kept
    # one that changed is built again from the signed version.
    from pipeline.runtimes.torchserve.liveops import rollout_archive

    where = live.Loaded(default.number, str(default.dir), "onnx")
    kept = rollout_archive(mar.stem, where, mine)
    assert kept.name == f"{mar.stem}.v{default.number}.mar" and kept.parent != default.dir
    assert signing.state(default.dir).state == signing.SIGNED
    kept.write_bytes(changed_bytes)
    capsys.readouterr()
    assert rollout_archive(mar.stem, where, mine) == kept
    assert "onnxruntime.py is not a file archive packs" in capsys.readouterr().err
    assert differences(kept, default.dir, "onnx") == []
    kept.write_bytes(b"not a zip")  # damaged on disk: built again too, not a traceback
    assert rollout_archive(mar.stem, where, mine) == kept
    assert "cannot be read as an archive" in capsys.readouterr().err
    assert differences(kept, default.dir, "onnx") == []
