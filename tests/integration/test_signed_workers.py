"""A runtime's worker checks a signed version again as it loads it (signing.recheck).

`pipeline serve` checks the version before it starts anything (tests/unit/test_signing.py),
but a KServe worker the supervisor restarts, or a Ray replica placed again on another node,
reads the store long after that: whoever can write to the store may have changed the
version since. The change here is the one issue 52 names: one ONNX weight ×1.5 and the
manifest's sha256 recorded anew, so the sha256 check every loader makes passes and only the
signature can catch it. The servers are started past the command's own check (launch.start,
Model's constructor), as a restart or a re-placement would find them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.core import signing
from pipeline.runtimes.kserve import launch
from pipeline.runtimes.kserve.config import CONFIG_FILE, RuntimeConfig, ServedExport
from pipeline.runtimes.ray import app
from pipeline.serving import launcher, loading, versions
from pipeline.serving.launcher import free_port
from pipeline.serving.server import ServeError
from tests.conftest import exited
from tests.tamper import alter_onnx_initializer

MODEL = "digits_lenet"
CHANGED = "model.onnx differs from the signed bytes"


@pytest.fixture(scope="module")
def signed(two_versions: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Version 1, signed, then changed in the store; and the signer's public key."""
    root = tmp_path_factory.mktemp("signed-workers")
    shutil.copytree(two_versions, root / "store")
    signing.keygen(root / "publisher.key")
    version = versions.get(MODEL, 1, root / "store").dir
    signing.sign(version, root / "publisher.key")
    public = root / "publisher.pub"
    loading.load(version, "onnx", 1, [str(public)])  # signed as it is: it loads
    alter_onnx_initializer(version, "classifier.8.weight", lambda w: w * np.float32(1.5))
    return {"version": version, "public": public}


def test_the_changed_version_passes_every_check_but_the_signature(
    signed: dict[str, Path],
) -> None:
    # No policy: the resealed manifest vouches for the changed file, and it loads.
    assert loading.load(signed["version"], "onnx", 1).torch_free
    with pytest.raises(signing.SignatureError, match=CHANGED):
        loading.load(signed["version"], "onnx", 1, [str(signed["public"])])


def test_a_kserve_worker_refuses_it_and_the_server_says_which_file(
    signed: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--trust's keys, as `serve` leaves them in its environment, go into the runtime's
    config for its workers."""
    monkeypatch.setenv(signing.TRUST_ENV, str(signed["public"]))
    served = ServedExport(MODEL, str(signed["version"]), "onnx", version=1)
    config = RuntimeConfig(models=[served], http_port=free_port(), grpc_port=free_port())
    try:
        with pytest.raises(ServeError) as refused:
            launch.start(config, tmp_path / "run", startup_timeout_s=120)
        assert all(exited(pid) for pid in launcher.orphans(tmp_path / "run"))  # nothing left
    finally:  # a server that did start (the check missing) is not left running
        launcher.stop(tmp_path / "run")
    assert CHANGED in str(refused.value), str(refused.value)[-2000:]
    assert RuntimeConfig.read(tmp_path / "run" / CONFIG_FILE).trust == [str(signed["public"])]


def test_a_ray_replica_refuses_it_with_the_keys_serve_was_given(
    signed: dict[str, Path],
) -> None:
    """What Serve constructs on a node: the deployment's own arguments, from build(), carry
    the keys (a node elsewhere has not serve's environment)."""
    model = {"name": MODEL, "export_dir": str(signed["version"]), "format": "onnx",
             "version": 1, "platform": "onnxruntime_onnx"}  # fmt: skip
    config = {"models": [model], "replica_cpus": 1, "replicas": 1, "autoscaling": {},
              "threads": 1, "max_batch_size": 8, "batch_wait_ms": 0.0,
              "trust": [str(signed["public"])]}  # fmt: skip
    replica = app.build(config, None)._bound_deployment.init_kwargs[MODEL]._bound_deployment
    with pytest.raises(signing.SignatureError, match=CHANGED):
        app.Model.func_or_class(*replica.init_args)
