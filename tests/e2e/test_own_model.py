"""docs/own-model.md, run as a user runs it: their own model's weights saved by their own
code → export → verify → archive → serve → curl (JSON, OIP, .npy) → infer → a served
verify → stop, every `<!-- test: own-model -->` command in order, as written.

As test_walkthrough does for the README: a copy of the repository with the project's
`.venv` linked in, free loopback ports for the server, and the server stopped even when
a step fails. Every served answer must equal the model's eager outputs (the user's class
with the user's weights, computed here) within the export's tolerance; the names the page
gives (folders, archives, the served model, the KServe runtime's model name) must be the
ones the commands use; and what the page quotes (the refusal of `pipeline train`, its
Python excerpts) must be what the code says and holds.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.core.manifest import read_manifest
from pipeline.runtimes.kserve.launch import served_export
from pipeline.serving.launcher import free_port
from tests.e2e.test_readme import FENCE, OWN_MODEL, OWN_MODEL_PAGE, blocks, commands
from tests.e2e.test_walkthrough import as_run_here, copied_repository, copy_env

MODEL = "docs/own-model/my_model.py:MyModel"
SLUG = "my_model_MyModel"  # what the page says archive and serve call it
SETOSA, VERSICOLOR, VIRGINICA = 0, 1, 2


def page_steps() -> list[str]:
    return [
        c
        for b in blocks()
        if b.page == OWN_MODEL_PAGE and b.marker == OWN_MODEL
        for c in commands(b)
    ]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with copied_repository(tmp_path_factory.mktemp("own-model") / "repo") as copy:
        yield copy


def _run(step: str, repo: Path, env: dict[str, str], ports: dict[str, int]) -> str:
    proc = subprocess.run(
        ["bash", "-c", as_run_here(step, ports)],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"`{step}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


def _eager(repo: Path, inputs: torch.Tensor) -> torch.Tensor:
    """The user's model with the user's weights, as their own code would run it."""
    spec = importlib.util.spec_from_file_location("own_model_page", repo / MODEL.split(":")[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.MyModel()
    model.load_state_dict(torch.load(repo / "artifacts/my_model.pt", weights_only=True))
    with torch.no_grad():
        return model.eval()(inputs)


def _one(out: dict[str, str], prefix: str, contains: str = "") -> str:
    found = [o for s, o in out.items() if s.startswith(prefix) and contains in s]
    assert len(found) == 1, f"the page has {len(found)} `{prefix}` steps with {contains!r}"
    return found[0]


def _served(answer: dict[str, Any]) -> torch.Tensor:
    """The logits of an answer: {"outputs": {"logits": ...}} or the OIP form."""
    outputs = answer["outputs"]
    if isinstance(outputs, dict):
        return torch.tensor(outputs["logits"])
    (logits,) = (o for o in outputs if o["name"] == "logits")
    return torch.tensor(logits["data"]).reshape(logits["shape"])


def _page_text() -> str:
    return OWN_MODEL_PAGE.read_text(encoding="utf-8")


def _check_quotes(repo: Path, env: dict[str, str]) -> None:
    """`pipeline train`'s refusal is quoted as it prints it, and each line of the page's
    Python excerpts is a line of the example's files."""
    proc = subprocess.run(
        [".venv/bin/pipeline", "train", "--model", MODEL],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    refusal = proc.stderr.strip().splitlines()[-1]
    assert refusal.startswith("error: ") and refusal in _page_text(), refusal
    source = {
        line.split("  #")[0].strip()
        for f in (repo / "docs/own-model").glob("*.py")
        for line in f.read_text().splitlines()
    }
    for m in FENCE.finditer(_page_text()):
        if m[1] == "python":
            lines = {ln.split("  #")[0].strip() for ln in m[2].splitlines()} - {"", "..."}
            assert lines <= source, f"not in docs/own-model/*.py: {sorted(lines - source)}"


def _kserve_name_is_the_pages(repo: Path) -> None:
    """The KServe block is not run (one server per page run), but the name it asks for is
    the one the runtime serves this export under."""
    served = served_export(repo / "artifacts" / SLUG / "export", "onnx")
    kserve = [b.text for b in blocks() if b.page == OWN_MODEL_PAGE and "--runtime kserve" in b.text]
    assert kserve and f"/v2/models/{served.name}/infer" in kserve[0], served.name


def test_own_model_page(repo: Path) -> None:
    steps = page_steps()
    kinds = " ".join(steps)
    for needed in (
        "train_my_model.py", "pipeline export", "pipeline verify", "pipeline archive",
        "pipeline serve", "curl ", "pipeline infer", "pipeline stop",
    ):  # fmt: skip
        assert needed in kinds, f"docs/own-model.md lost its `{needed}` step"
    ports = {"port": free_port(), "management-port": free_port(), "metrics-port": free_port()}
    env = copy_env(repo)
    # One intra-op thread, as under `make test`'s xdist workers (tests/conftest.py): the
    # training script's tiny steps crawled with two threads on a busy 2-core machine.
    env.setdefault("OMP_NUM_THREADS", "1")
    before = {p.name for p in repo.iterdir()}

    out = {step: _run(step, repo, env, ports) for step in steps}

    assert "training accuracy" in _one(out, ".venv/bin/python docs/own-model/train_my_model.py")
    export_dir = repo / "artifacts" / SLUG / "export"
    export = _one(out, ".venv/bin/pipeline export")
    assert f"to artifacts/{SLUG}/export" in export and "model.onnx" in export, export
    manifest = read_manifest(export_dir)
    assert manifest.model.name == MODEL
    tol = {"atol": manifest.tolerance.atol, "rtol": manifest.tolerance.rtol}
    local = out.get(f".venv/bin/pipeline verify --model {MODEL}", "")
    assert "PASS" in local, f"the page lost its plain verify step, or it failed: {local}"
    archive = _one(out, ".venv/bin/pipeline archive")
    for fmt in ("ts", "onnx"):
        name = f"model_store/{SLUG}_{fmt}.mar"
        assert name in archive and (repo / name).is_file() and name.split("/")[1] in _page_text()
    serve = _one(out, ".venv/bin/pipeline serve")
    assert f"serving: {SLUG}_ts" in serve, serve

    flowers = json.loads((repo / "docs/own-model/flowers.json").read_text())
    two = torch.tensor(flowers["inputs"]["measurements"])
    answer = _served(json.loads(_one(out, "curl ", "flowers.json")))
    torch.testing.assert_close(answer, _eager(repo, two), **tol)
    assert answer.argmax(1).tolist() == [SETOSA, VIRGINICA]

    (oip,) = json.loads((repo / "docs/own-model/flower.oip.json").read_text())["inputs"]
    one = torch.tensor(oip["data"]).reshape(oip["shape"])
    npy = torch.from_numpy(np.load(io.BytesIO((repo / "artifacts/flower.npy").read_bytes())))
    torch.testing.assert_close(npy, one)  # the page's .npy is the OIP body's flower
    expected = _eager(repo, one)
    for answer in (
        _one(out, "curl ", "flower.oip.json"),
        _one(out, "curl ", "flower.npy"),
        _one(out, ".venv/bin/pipeline infer"),
    ):
        logits = _served(json.loads(answer))
        torch.testing.assert_close(logits, expected, **tol)
        assert logits.argmax(1).tolist() == [VERSICOLOR]

    served_verify = _one(out, ".venv/bin/pipeline verify", "--backend torchserve")
    assert re.search(r"PASS: \d+/\d+ checks", served_verify), served_verify
    assert "stopped TorchServe" in out[steps[-1]]
    _kserve_name_is_the_pages(repo)
    _check_quotes(repo, env)
    new = {p.name for p in repo.iterdir()} - before
    assert new <= {"artifacts"}, f"the page wrote into the repository root: {sorted(new)}"
