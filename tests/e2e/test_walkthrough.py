"""The README's example, run as a newcomer runs it: train → export → verify → serve →
curl → infer → C++ client → stop, every command as written.

It runs in a copy of the repository (the files git tracks or would track), with
the project's `.venv` linked in and the copy's code first on the path, so
`artifacts/`, `model_store/` and `cpp_client/build/` are the copy's and a user's own
server is never touched. Two things differ from the page, both on purpose: the
server gets free loopback ports (8080 may be taken on a test machine), and
`pipeline stop` also runs when a command fails. `make cpp` starts with the first
command (it reads nothing the others write) and is waited for at its place.

It is also the suite's command-line run of train → export → verify: what those
print and write is checked, and a verify with no tolerance must fail naming the
backend (one CLI training for both, not two).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipeline.serving.launcher import free_port, stop
from tests.conftest import assert_clean_error
from tests.e2e.test_readme import ROOT, WALKTHROUGH, blocks, commands

DIGIT = 7  # docs/digit.png: a 7 from the digits validation split


def walkthrough() -> list[str]:
    readme = ROOT / "README.md"
    return [
        c for b in blocks() if b.page == readme and b.marker == WALKTHROUGH for c in commands(b)
    ]


def copy_repository(copy: Path) -> Path:
    """The files git tracks or would track, copied to `copy` with their times (a `make`
    target in the copy compares the copy's pyproject.toml with the linked venv's
    .installed stamp, and reinstalls the venv, from the copy, when it is newer), with the
    project's `.venv` linked in."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    stamp = ROOT / ".venv" / ".installed"
    if not stamp.is_file() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        # Else the copy's `make` would reinstall the shared venv from the copy, which is
        # deleted after the test: every later import of `pipeline` would fail.
        pytest.fail("pyproject.toml is newer than .venv/.installed: run `make venv` first")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    return copy


def copy_env(repo: Path) -> dict[str, str]:
    """The environment the page's commands run in: the copy's code, not the checkout the
    venv was installed from, and the copy's artifacts/."""
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_ARTIFACTS"}
    env["PYTHONPATH"] = str(repo)
    return env


@contextlib.contextmanager
def copied_repository(copy: Path) -> Iterator[Path]:
    """`copy_repository(copy)`, and whatever server a page's commands started from it is
    stopped after, whatever happened."""
    copy = copy_repository(copy)
    try:
        yield copy
    finally:
        stop(copy / "artifacts" / "serve")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with copied_repository(tmp_path_factory.mktemp("newcomer") / "repo") as copy:
        yield copy


def as_run_here(command: str, ports: dict[str, int]) -> str:
    """The command with this test's free ports instead of the defaults."""
    command = command.replace("127.0.0.1:8080", f"127.0.0.1:{ports['port']}")
    if command.startswith(".venv/bin/pipeline serve"):
        command += "".join(f" --{k} {v}" for k, v in ports.items())
    return command


def _top_class(answer: dict) -> int:
    top = answer["topk"]
    top = top[0] if isinstance(top[0], list) else top
    return int(top[0]["class"])


# Steps that read nothing an earlier step writes: `make cpp` is mostly the compiler
# while training and exporting are mostly one Python thread, so it starts with the
# first step and is waited for at its place in the page.
INDEPENDENT = ("make cpp",)
LOCAL_VERIFY = ".venv/bin/pipeline verify --model digits_lenet"


def _local_checks(repo: Path, out: dict[str, str]) -> None:
    """What `train`, `export` and a plain `verify` print and write, checked right after
    that verify (later verifies rewrite parity.json)."""
    train = next(o for s, o in out.items() if s.startswith(".venv/bin/pipeline train"))
    assert "val_accuracy" in train and (repo / "artifacts/digits_lenet/checkpoint.json").is_file()
    export = next(o for s, o in out.items() if s.startswith(".venv/bin/pipeline export"))
    assert "model.torchscript.pt" in export and "model.onnx" in export, export
    verify = out[LOCAL_VERIFY]
    assert "Parity vs eager PyTorch" in verify and "PASS" in verify, verify
    parity = json.loads((repo / "artifacts/digits_lenet/parity.json").read_text())
    assert parity["passed"] is True


def _failing_verify(repo: Path, env: dict[str, str]) -> None:
    """A verify that fails exits non-zero and names the backend and its error (no traceback)."""
    proc = subprocess.run(
        [".venv/bin/pipeline", "verify", "--model", "digits_lenet", "--atol", "0", "--rtol", "0"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert_clean_error(proc, "Parity FAILED for digits_lenet", "onnxruntime / ", "max abs err")


def test_walkthrough(repo: Path) -> None:
    steps = walkthrough()
    assert steps, f"README.md has no {WALKTHROUGH} blocks"
    kinds = " ".join(steps)
    for needed in ("pipeline train", "pipeline serve", "curl ", "run_torchscript", "pipeline stop"):
        assert needed in kinds, f"the README's example lost its `{needed}` step"
    assert LOCAL_VERIFY in steps, f"the README's example lost its `{LOCAL_VERIFY}` step"
    ports = {"port": free_port(), "management-port": free_port(), "metrics-port": free_port()}
    env = copy_env(repo)
    out: dict[str, str] = {}
    before = {p.name for p in repo.iterdir()}

    def launch(step: str) -> subprocess.Popen[str]:
        command = ["bash", "-c", as_run_here(step, ports)]
        return subprocess.Popen(
            command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    early = {s: launch(s) for s in steps if s.startswith(INDEPENDENT)}
    try:
        for step in steps:
            proc = early.pop(step, None) or launch(step)
            try:
                stdout, stderr = proc.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            assert proc.returncode == 0, f"`{step}` failed ({proc.returncode}):\n{stdout}\n{stderr}"
            out[step] = stdout
            if step == LOCAL_VERIFY:
                _local_checks(repo, out)
    finally:
        for proc in early.values():  # a step failed before their turn
            proc.kill()
            proc.communicate()

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
    _failing_verify(repo, env)
    new = {p.name for p in repo.iterdir()} - before
    assert new <= {"artifacts"}, f"the example wrote into the repository root: {sorted(new)}"
