"""The README's example, run as a newcomer runs it: train → export → verify → serve →
curl → infer → C++ client → stop, every command as written.

It runs in a copy of the repository (the files git tracks or would track), with
the project's `.venv` linked in and the copy's code first on the path, so
`artifacts/`, `model_store/` and `cpp_client/build/` are the copy's and a user's own
server is never touched. Two things differ from the page, both on purpose: the
server gets free loopback ports (8080 may be taken on a test machine), and
`pipeline stop` also runs when a command fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipeline.serving.launcher import free_port, stop
from tests.e2e.test_readme import ROOT, WALKTHROUGH, blocks, commands

DIGIT = 7  # docs/digit.png: a 7 from the digits validation split


def walkthrough() -> list[str]:
    readme = ROOT / "README.md"
    return [
        c for b in blocks() if b.page == readme and b.marker == WALKTHROUGH for c in commands(b)
    ]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    copy = tmp_path_factory.mktemp("newcomer") / "repo"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    try:
        yield copy
    finally:
        stop(copy / "artifacts" / "serve")


def _as_run_here(command: str, ports: dict[str, int]) -> str:
    """The command with this test's free ports instead of the defaults."""
    command = command.replace("127.0.0.1:8080", f"127.0.0.1:{ports['port']}")
    if command.startswith(".venv/bin/pipeline serve"):
        command += "".join(f" --{k} {v}" for k, v in ports.items())
    return command


def _top_class(answer: dict) -> int:
    top = answer["topk"]
    top = top[0] if isinstance(top[0], list) else top
    return int(top[0]["class"])


def test_walkthrough(repo: Path) -> None:
    steps = walkthrough()
    assert steps, f"README.md has no {WALKTHROUGH} blocks"
    kinds = " ".join(steps)
    for needed in ("pipeline train", "pipeline serve", "curl ", "run_torchscript", "pipeline stop"):
        assert needed in kinds, f"the README's example lost its `{needed}` step"
    ports = {"port": free_port(), "management-port": free_port(), "metrics-port": free_port()}
    # The copy's code, not the checkout the venv was installed from.
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_ARTIFACTS"}
    env["PYTHONPATH"] = str(repo)
    out: dict[str, str] = {}
    before = {p.name for p in repo.iterdir()}
    for step in steps:
        proc = subprocess.run(
            ["bash", "-c", _as_run_here(step, ports)],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, (
            f"`{step}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
        out[step] = proc.stdout

    curl = next(o for s, o in out.items() if s.startswith("curl "))
    assert _top_class(json.loads(curl)) == DIGIT, curl
    infer = next(o for s, o in out.items() if s.startswith(".venv/bin/pipeline infer"))
    assert _top_class(json.loads(infer)) == DIGIT, infer
    cpp = next(s for s in out if "run_torchscript" in s)
    written = repo / cpp.split("--outputs")[1].split()[0]
    assert written.is_file() and str(written.resolve()).startswith(str(repo / "artifacts"))
    golden = torch.load(repo / "artifacts/digits_lenet/export/golden.pt", weights_only=True)
    cases = torch.load(written, weights_only=True)  # a tuple of cases, each a tuple of outputs
    torch.testing.assert_close(cases[0][0], golden["outputs"]["logits"], atol=1e-4, rtol=1e-4)
    assert "stopped TorchServe" in out[steps[-1]]
    new = {p.name for p in repo.iterdir()} - before
    assert new <= {"artifacts"}, f"the example wrote into the repository root: {sorted(new)}"
