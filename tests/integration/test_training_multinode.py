"""Training across machines: two torchrun launchers as two nodes (c10d rendezvous).

Both "nodes" run on this host over loopback. Each launcher has its own
--artifacts-dir, as two machines would have their own disks: rank 0 (whichever
launcher joins the rendezvous first) writes, the other writes nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from pipeline.core.checkpoint import load_checkpoint
from pipeline.train import TrainConfig, train

TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def test_two_nodes_match_one_process_over_the_same_global_batch(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    port, run_id = free_port(), f"multinode-{uuid.uuid4().hex[:8]}"
    train_args = ["train", "--model", "digits_mlp", "--epochs", "2", "--batch-size", "64",
                  "--no-progress", "--no-report"]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip
    nodes = ["a", "b"]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node in nodes:
            # Node a hosts the rendezvous store; node b connects to it (retrying
            # until it is up), as a second machine would.
            cmd = [str(torchrun), "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", run_id, "--rdzv-conf", f"is_host={str(node == 'a').lower()}",
                   "--local-addr", "127.0.0.1", "--max-restarts", "0",
                   "-m", "pipeline", "--artifacts-dir", str(tmp_path / node), *train_args]  # fmt: skip
            with (tmp_path / f"{node}.out").open("wb") as out, (tmp_path / f"{node}.err").open("wb") as err:  # fmt: skip
                procs[node] = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=tmp_path, env=env)
        deadline = time.monotonic() + TIMEOUT_S
        for proc in procs.values():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()  # torchrun stops its workers on SIGTERM
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    logs = "\n".join(
        f"--- node {n}: rc={procs[n].returncode}\nstdout:\n{tail(tmp_path / f'{n}.out')}\n"
        f"stderr:\n{tail(tmp_path / f'{n}.err')}"
        for n in nodes
    )
    assert all(p.returncode == 0 for p in procs.values()), logs
    written = [n for n in nodes if (tmp_path / n / "digits_mlp" / "checkpoint.pt").exists()]
    assert len(written) == 1, logs  # only global rank 0 writes, on its own node
    stdout = "".join((tmp_path / f"{n}.out").read_text() for n in nodes)
    assert stdout.count("checkpoint:") == 1, logs

    multi = load_checkpoint(tmp_path / written[0] / "digits_mlp" / "checkpoint.pt")
    assert multi.meta["world_size"] == 2
    single = train(
        TrainConfig(model="digits_mlp", out=tmp_path / "single" / "checkpoint.pt", epochs=2,
                    batch_size=64, progress=False, report=False, device="cpu")
    )  # fmt: skip
    for name, tensor in single.checkpoint.state_dict.items():
        torch.testing.assert_close(multi.state_dict[name], tensor, atol=1e-6, rtol=0)
    for a, b in zip(multi.meta["metrics"]["history"], single.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1e-9)
