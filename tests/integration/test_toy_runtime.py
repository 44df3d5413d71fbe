"""The runtime contract is the seam: runtimes written only in tests/toy_runtime/ register
through pipeline.serving.runtime without a change under pipeline/. One with the core
alone goes through `pipeline serve`, `infer`, `verify`, `loadtest` (on the running
server and on a private one) and `bench`, the same commands a user types, in-process,
and `pipeline rollout` refuses it; the toy, the same server with the versions
capability, goes through rollout, status and rollback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli import main as cli_main
from pipeline.export import ExportResult
from pipeline.serving import runtime
from pipeline.serving.launcher import free_port, stop
from tests import toy_runtime
from tests.manifest_reads import counted
from tests.tamper import copy_export

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def toy() -> Iterator[runtime.Runtime]:
    with toy_runtime.registered() as rt:
        yield rt


@pytest.fixture
def bare() -> Iterator[runtime.Runtime]:
    with toy_runtime.registered(toy_runtime.BARE_RUNTIME) as rt:
        yield rt


def test_a_runtime_of_the_core_alone_goes_through_every_command(
    bare: runtime.Runtime,
    exported: ExportResult,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    artifacts = tmp_path / "artifacts"
    copy_export(exported, artifacts / "digits_lenet" / "export")
    run_dir = tmp_path / "run"
    export = (artifacts / "digits_lenet" / "export").resolve()
    reads: list[tuple[str, int]] = []

    def main(argv: list[str]) -> int:
        """The CLI in-process, counting how often it reads the export's manifest."""
        with counted() as counts:
            code = cli_main(argv)
        reads.append((" ".join(argv[2:4]), counts[export]))
        return code

    common = ["--artifacts-dir", str(artifacts)]
    assert "bare" in runtime.names() and runtime.get("bare") is bare
    try:
        # serve: its own option group, and another runtime's option refused
        assert main([*common, "serve", "--runtime", "bare", "--grpc-port", "9"]) == 1
        assert "--grpc-port is for --runtime kserve" in capsys.readouterr().err
        port = str(free_port())
        code = main([*common, "serve", "--runtime", "bare", "--model", "digits_lenet",
                     "--bare-format", "onnx", "--port", port, "--run-dir", str(run_dir)])  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0 and "the bare runtime is up" in out, out

        golden = artifacts / "digits_lenet" / "export" / "golden.pt"
        assert main([*common, "infer", "--model", "digits_lenet", str(golden),
                     "--run-dir", str(run_dir)]) == 0  # fmt: skip
        answer = json.loads(capsys.readouterr().out)
        assert answer["model_name"] == "digits_lenet" and answer["outputs"][0]["shape"][-1] == 10

        report = tmp_path / "parity.json"
        code = main([*common, "verify", "--model", "digits_lenet", "--backend", "bare",
                     "--run-dir", str(run_dir), "--report", str(report)])  # fmt: skip
        said = capsys.readouterr()
        assert code == 0, said.out + said.err
        checked = {r["backend"] for r in json.loads(report.read_text())["rows"]}
        assert checked - {"golden file"} == {"bare/onnx"}, checked  # golden: always checked

        for serve in ([], ["--serve", "--runtime", "bare"]):
            code = main([*common, "loadtest", "--model", "digits_lenet", "--requests", "40",
                         "--concurrency", "4", "--run-dir", str(run_dir), *serve])  # fmt: skip
            said = capsys.readouterr()
            assert code == 0 and "PASSED" in said.out, said.out + said.err
        # its own limits, from its declaration: JSON only, no worker replacement
        code = main([*common, "loadtest", "--model", "digits_lenet", "--requests", "4",
                     "--encodings", "npy", "--run-dir", str(run_dir)])  # fmt: skip
        assert code != 0 and "the bare runtime reads the encodings json" in capsys.readouterr().err

        bench_dir = tmp_path / "bench"
        code = main([*common, "bench", "--quick", "--runtime", "bare", "--model", "digits_lenet",
                     "--serve-model", "digits_lenet", "--out-dir", str(bench_dir)])  # fmt: skip
        said = capsys.readouterr()
        assert code == 0, said.out + said.err
        served = json.loads((bench_dir / "bench.json").read_text())["served"]
        backends = {p["backend"] for p in served}
        assert backends and all(b.startswith("bare/") for b in backends), backends
        assert all(p["failed"] == 0 for p in served)

        # no versions capability: rollout refuses it, naming the runtime, and nothing moves
        code = main([*common, "rollout", "--model", "digits_lenet", "--version", "2",
                     "--run-dir", str(run_dir)])  # fmt: skip
        said = capsys.readouterr()
        assert code == 1 and "the bare runtime cannot change versions" in said.err, said.err
    finally:
        stop(run_dir)
    # Every command read the export's manifest at most once (the layers pass it on).
    assert all(n <= 1 for _, n in reads), reads
    assert main(["stop", "--run-dir", str(run_dir)]) == 0
    assert "no the bare runtime was running" not in capsys.readouterr().out


def test_nothing_under_pipeline_names_the_toy_runtime() -> None:
    # "without changing any file under pipeline/": the package knows nothing of it.
    mentions = [
        p for p in (ROOT / "pipeline").rglob("*.py") if "toy_runtime" in p.read_text("utf-8")
    ]
    assert not mentions


def test_the_toy_goes_through_rollout_with_the_shared_live_state(
    toy: runtime.Runtime, two_versions: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Versions need no change under pipeline/ either: the toy keeps the run folder's live
    state with pipeline.serving.live, and rollout, status and rollback drive it."""
    store = tmp_path / "store"
    shutil.copytree(two_versions, store)
    run_dir = tmp_path / "run"
    where = ["--store", str(store), "--run-dir", str(run_dir)]
    assert cli_main(["serve", "--runtime", "toy", "--model", "digits_lenet",
                     "--port", str(free_port()), *where]) == 0  # fmt: skip
    try:
        capsys.readouterr()
        assert cli_main(["rollout", "--model", "digits_lenet", "--version", "2", *where]) == 0
        said = capsys.readouterr().out
        assert "checking version 2 through the live server" in said and "is the default" in said
        assert cli_main(["status", "--json", *where]) == 0
        served = json.loads(capsys.readouterr().out)["server"]["models"]["digits_lenet"]
        assert (served["versions"], served["default"]) == ([2], 2)
        # Without --store: the running server's (it judged by model_store's versions).
        load = ["loadtest", "--model", "digits_lenet", "--requests", "40", "--concurrency", "4",
                "--by-version", "--run-dir", str(run_dir)]  # fmt: skip
        code = cli_main(load)
        said = capsys.readouterr()
        assert code == 0 and "answers by version: 2: 40" in said.out, said.out + said.err
        assert cli_main([*load, "--store", str(tmp_path / "nowhere")]) == 1
        assert f"there is no store at {tmp_path / 'nowhere'}" in capsys.readouterr().err
        assert cli_main(["rollback", "--model", "digits_lenet", *where]) == 0
        assert "version 1 is the default again" in capsys.readouterr().out
    finally:
        stop(run_dir)
