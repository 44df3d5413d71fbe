"""A rollout whose live check cannot run unloads the version it loaded (a user's trial,
2026-11-29: a version folder holding another model's export was refused, exit 1, and
stayed loaded and answering on /versions/5/infer). The runtime's versions capability is
replaced by a recorder here: what is tested is the rollout's own sequence of states;
loading on a real server is tests/integration/test_rollout.py's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.core.errors import ArtifactError
from pipeline.serving import live, rollout, versions
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.server import Server

MODEL = "digits_lenet"


def _published(store: Path, number: int) -> Path:
    folder = store / MODEL / str(number)
    folder.mkdir(parents=True)
    (folder / "publish.json").write_text(
        json.dumps({"model": MODEL, "version": number, "formats": ["onnx"]})
    )
    return folder


class _Recorder:
    """The versions capability: records each state it is asked to apply."""

    def __init__(self) -> None:
        self.applied: list[live.LiveState] = []

    def apply_live(self, server: Server, state: live.LiveState, timeout_s: float) -> None:
        self.applied.append(state)


def test_a_live_check_that_cannot_run_unloads_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    one, _ = _published(store, 1), _published(store, 5)
    versions.write_pointer(MODEL, versions.Pointer(1, []), store)
    served = {MODEL: live.ModelVersions({1: live.Loaded(1, str(one), "onnx")}, 1)}
    state = live.LiveState(3, served)
    server = Server(runtime="kserve", pid=0, run_dir=str(tmp_path / "run"), inference_url="",
                    metrics_url="", models=[MODEL],
                    served={MODEL: ServedInfo(MODEL, "onnx")})  # fmt: skip
    recorder = _Recorder()
    rt = SimpleNamespace(versions=recorder, name="kserve")
    monkeypatch.setattr(rollout, "running", lambda run_dir: (server, rt, state))

    def unreadable(*args: Any) -> str:
        raise ArtifactError(f"{store}/{MODEL}/5 holds an export of 'digits_mlp', not {MODEL!r}.")

    monkeypatch.setattr(rollout, "live_check", unreadable)
    config = rollout.RolloutConfig(MODEL, tmp_path / "run", version=5, store=store)
    with pytest.raises(ArtifactError, match="digits_mlp"):
        rollout.rollout(config, say=lambda _: None)
    loaded, restored = recorder.applied
    assert set(loaded.models[MODEL].versions) == {1, 5}
    assert set(restored.models[MODEL].versions) == {1} and restored.models[MODEL].default == 1
    assert restored.generation > loaded.generation
    assert versions.read_pointer(MODEL, store).default == 1


def test_a_rollout_or_rollback_from_another_store_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user's trial (2026-11-29): `rollout --version 1 --store s2` loaded s2's version 1
    # into a server serving model_store (another version 1 there), past its trust policy,
    # and moved s2's pointer; a plain rollback then kept s2's weights as model_store's v1.
    store, other = tmp_path / "store", tmp_path / "s2"
    one = _published(store, 1)
    _published(store, 2), _published(other, 1), _published(other, 2)
    for where in (store, other):
        versions.write_pointer(MODEL, versions.Pointer(1, []), where)
    served = {MODEL: live.ModelVersions({1: live.Loaded(1, str(one), "onnx")}, 1)}
    server = Server(runtime="kserve", pid=0, run_dir=str(tmp_path / "run"), inference_url="",
                    metrics_url="", models=[MODEL],
                    served={MODEL: ServedInfo(MODEL, "onnx")})  # fmt: skip
    recorder = _Recorder()
    rt = SimpleNamespace(versions=recorder, name="kserve")
    monkeypatch.setattr(rollout, "running", lambda run_dir: (server, rt, live.LiveState(3, served)))
    config = rollout.RolloutConfig(MODEL, tmp_path / "run", version=2, store=other)
    with pytest.raises(versions.VersionError, match=f"pass --store {store.resolve()}"):
        rollout.rollout(config, say=lambda _: None)
    with pytest.raises(versions.VersionError, match="another one"):
        rollout.rollback(MODEL, tmp_path / "run", other, say=lambda _: None)
    assert recorder.applied == []  # nothing loaded, nothing moved
    assert versions.read_pointer(MODEL, other).default == 1


def test_torchserve_started_without_live_versions_is_told_how_to_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said "cannot change versions while it serves; restart it with `pipeline serve`",
    # never naming --live-versions, with which TorchServe can.
    from pipeline.core.errors import PipelineError

    run_dir = tmp_path / "run"
    server = Server(runtime="torchserve", pid=0, run_dir=str(run_dir), inference_url="",
                    metrics_url="", models=[f"{MODEL}_onnx"],
                    command=["serve", "--model", MODEL, "--run-dir", str(run_dir)])  # fmt: skip
    monkeypatch.setattr(Server, "load", classmethod(lambda cls, where: server))
    monkeypatch.setattr(Server, "alive", lambda self: True)
    with pytest.raises(PipelineError) as err:
        rollout.running(run_dir)
    said = str(err.value)
    assert "when started with --live-versions" in said, said
    assert f"pipeline serve --model {MODEL} --run-dir {run_dir} --live-versions" in said, said
