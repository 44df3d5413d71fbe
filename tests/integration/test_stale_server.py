"""A stale server is diagnosed, not reported as a wrong model (issue 20's scenario).

As a user runs it, through the CLI: export, archive, serve, then export again
(another checkpoint) while the old archive is still served. `infer -v`,
`loadtest` and `verify --backend torchserve` each say once, in one sentence,
that the served model is the older and what to run; running exactly that
makes all three agree with the export again.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.serving.launcher import free_port, stop
from tests.conftest import run_cli

MODEL = "my_cell"  # scripted and small: two exports take seconds


def _export(artifacts: Path, seed: int) -> None:
    proc = run_cli(
        "--artifacts-dir", artifacts, "export", "--model", MODEL, "--random-init", "--seed", seed
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path | list[str]]]:
    root = tmp_path_factory.mktemp("stale")
    artifacts, store, run_dir = root / "artifacts", root / "store", root / "run"
    ports = [
        "--port", str(free_port()),
        "--management-port", str(free_port()),
        "--metrics-port", str(free_port()),
    ]  # fmt: skip
    body = root / "cell.json"
    body.write_text(json.dumps({"inputs": {"x": [[0.5, -1.0, 2.0, 0.1]], "h": [[0.0] * 4]}}))
    _export(artifacts, seed=0)
    proc = run_cli("--artifacts-dir", artifacts, "archive", "--model", MODEL, "--store", store)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        proc = run_cli("serve", "--store", store, "--run-dir", run_dir, *ports)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _export(artifacts, seed=1)  # retrained and re-exported while the old one is served
        yield {
            "artifacts": artifacts,
            "store": store,
            "run_dir": run_dir,
            "ports": ports,
            "body": body,
        }
    finally:
        stop(run_dir)


def _cli(setup: dict, *args: str | Path) -> tuple[int, str]:
    proc = run_cli("--artifacts-dir", setup["artifacts"], *args)
    return proc.returncode, proc.stdout + proc.stderr


STALE = re.compile(
    r"The server answers my_cell from another export than \S+ \(my_cell_ts\), and the served "
    r"model is the older \(served: exported \S+ from checkpoint [0-9a-f]{8}; this export: "
    r"exported \S+ from checkpoint [0-9a-f]{8}\): run `(?P<fix>[^`]+)` to serve this export "
    r"\(or, where the server serves a published version, `pipeline publish` this export and "
    r"`pipeline rollout` it: a restart serves the store's default again\)\."
)


def _one_diagnosis(output: str) -> str:
    assert len(STALE.findall(output)) == 1, output  # said once, not per request or format
    return STALE.search(output)["fix"]  # type: ignore[index]


def test_stale_server_is_diagnosed_by_infer_loadtest_and_verify_and_the_fix_works(
    setup: dict,
) -> None:
    run = ("--run-dir", setup["run_dir"])
    rc, out = _cli(setup, "-v", "infer", "--model", MODEL, setup["body"], *run)
    assert rc == 0, out  # the answer still comes, after the warning
    fix = _one_diagnosis(out)
    # The server's own folders and ports, and the export the check read: run as printed.
    store, run_dir, export = setup["store"], setup["run_dir"], setup["artifacts"] / MODEL / "export"
    assert fix == (
        f"pipeline archive --model {MODEL} --export-dir {export} --store {store} && "
        f"pipeline stop --run-dir {run_dir} && "
        + shlex.join(
            ["pipeline", "serve", "--store", str(store), "--run-dir", str(run_dir), *setup["ports"]]
        )
    )

    rc, out = _cli(
        setup, "loadtest", "--model", MODEL, "--requests", "20", "--concurrency", "2", *run
    )
    assert rc == 1, out
    assert _one_diagnosis(out) == fix
    assert "wrong" not in out  # refused before sending: no parity failures to read

    rc, out = _cli(setup, "verify", "--model", MODEL, "--backend", "torchserve", *run)
    assert rc != 0, out
    assert _one_diagnosis(out) == fix

    # Run exactly what the sentence says.
    for step in fix.split(" && "):
        proc = run_cli(*shlex.split(step)[1:])
        assert proc.returncode == 0, proc.stdout + proc.stderr
    rc, out = _cli(setup, "-v", "infer", "--model", MODEL, setup["body"], *run)
    assert rc == 0 and "my_cell_ts serves the export in" in out and not STALE.search(out), out
    rc, out = _cli(setup, "verify", "--model", MODEL, "--backend", "torchserve", *run)
    assert rc == 0, out
    rc, out = _cli(
        setup, "loadtest", "--model", MODEL, "--requests", "20", "--concurrency", "2", *run
    )
    assert rc == 0 and "PASSED" in out, out
