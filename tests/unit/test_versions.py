"""The versioned store's pointer, the live state and its acknowledgements, the canary's
split and bounds, and what a (re)started KServe worker loads: in process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.runtimes.kserve.config import ServedExport
from pipeline.runtimes.kserve.liveops import initial
from pipeline.serving import live, versions
from pipeline.serving.publish import report_vouches
from pipeline.serving.rollout import Bounds, RolloutConfig
from pipeline.serving.status import status_lines, troubled


def _version(store: Path, number: int, model: str = "m") -> None:
    folder = store / model / str(number)
    folder.mkdir(parents=True)
    (folder / versions.PROVENANCE).write_text(json.dumps({"version": number, "formats": ["onnx"]}))


def test_the_pointer_moves_forward_and_back_through_its_history(tmp_path: Path) -> None:
    for n in (1, 2, 3):
        _version(tmp_path, n)
    (tmp_path / "m" / "4").mkdir()  # being written (no publish.json): not a version
    assert [v.number for v in versions.versions("m", tmp_path)] == [1, 2, 3]
    assert versions.default("m", tmp_path).number == 3  # no pointer yet: the newest
    versions.set_default("m", 1, tmp_path)
    versions.set_default("m", 2, tmp_path)
    versions.set_default("m", 3, tmp_path)
    assert versions.read_pointer("m", tmp_path) == versions.Pointer(3, [1, 2])
    assert versions.previous("m", tmp_path) == 2
    assert versions.roll_back_pointer("m", tmp_path) == versions.Pointer(2, [1])
    assert versions.roll_back_pointer("m", tmp_path) == versions.Pointer(1, [])
    with pytest.raises(versions.VersionError, match="no earlier default"):
        versions.roll_back_pointer("m", tmp_path)
    with pytest.raises(versions.VersionError, match=r"has no version 7 .* it has 1, 2, 3"):
        versions.set_default("m", 7, tmp_path)
    assert versions.number_of(tmp_path / "m" / "2") == 2
    assert versions.number_of(tmp_path) is None


def test_a_report_vouches_only_for_a_passing_check_of_this_export_written_after_it(
    tmp_path: Path,
) -> None:
    from pipeline_runtime.manifest import (
        ArtifactRecord,
        CheckpointRef,
        Manifest,
        ModelRecord,
        TensorRecord,
        Tolerance,
    )

    export_dir = tmp_path / "export"
    export_dir.mkdir()
    held = {
        "torchscript": ArtifactRecord("model.torchscript.pt", "script", "0" * 64),
        "pt2": ArtifactRecord("model.pt2", "aotinductor", "1" * 64),
    }
    manifest = Manifest(
        model=ModelRecord("m"),
        inputs=(TensorRecord("x", ("batch", 4), "float32"),),
        outputs=(TensorRecord("y", ("batch", 2), "float32"),),
        tolerance=Tolerance(1e-5, 1e-4),
        checkpoint=CheckpointRef("../checkpoint.pt", "0" * 64),
        artifacts=held,
    )
    (export_dir / "manifest.json").write_text(manifest.dumps())
    report = tmp_path / "parity.json"
    assert "no verify report" in report_vouches(report, export_dir)
    report.write_text(json.dumps({"export_dir": str(export_dir), "passed": False}))
    assert "failed verify" in report_vouches(report, export_dir)
    report.write_text(json.dumps({"export_dir": str(tmp_path / "other"), "passed": True}))
    assert "not" in report_vouches(report, export_dir)
    rows = [{"backend": "torchscript"}, {"backend": "pt2"}]
    report.write_text(json.dumps({"export_dir": str(export_dir), "passed": True, "rows": rows}))
    assert report_vouches(report, export_dir) is None
    # `verify --backend torchscript` passed: it vouched for the .pt2 nothing had run.
    one = {"export_dir": str(export_dir), "passed": True, "rows": rows[:1]}
    report.write_text(json.dumps(one))
    assert report_vouches(report, export_dir) == f"{report} did not check pt2"
    later = report.stat().st_mtime + 10
    os.utime(export_dir / "manifest.json", (later, later))
    assert "older than the export" in report_vouches(report, export_dir)


@pytest.mark.parametrize(("percent", "calls", "wanted"), [(20, 100, 20), (10, 50, 5), (50, 7, 3)])
def test_the_canary_gets_its_share_exactly(percent: float, calls: int, wanted: int) -> None:
    split = live.Splitter()
    assert sum(split.to_canary(percent) for _ in range(calls)) == wanted


def test_bounds_judge_a_canary_only_once_it_has_answers_enough() -> None:
    bounds = Bounds(max_error_rate=0.1, max_p99_ratio=2.0, min_requests=10)
    slow, fast = live.Tally(), live.Tally()
    for i in range(100):
        fast.add(1.0 + i / 100, ok=True)
    for _ in range(9):
        slow.add(50.0, ok=False)
    assert bounds.breach(slow, fast) is None  # 9 answers: too few to judge
    assert bounds.unjudged(slow) == (
        "it answered 9 of the 10 requests it is judged on (--min-requests)"
    )  # and said so: --promote refuses it
    slow.add(50.0, ok=True)
    assert "error rate 90.0% (9 of 10)" in bounds.breach(slow, fast)
    for _ in range(100):
        slow.add(50.0, ok=True)
    assert "p99 50.00 ms is over --max-p99-ratio 2" in bounds.breach(slow, fast)
    assert bounds.breach(fast, fast) is None


def test_the_live_state_round_trips_and_acknowledgements_are_awaited(tmp_path: Path) -> None:
    state = live.LiveState(
        3,
        {"m": live.ModelVersions({1: live.Loaded(1, "/a", "onnx"), 2: live.Loaded(2, "/b", "onnx")}, 1, 2, 20.0)},
    )  # fmt: skip
    live.write(tmp_path, state)
    assert live.read(tmp_path) == state
    live.ack(tmp_path, 0, 3)
    with pytest.raises(live.LiveError, match=r"worker\(s\) \[1\] had not applied generation 3"):
        live.wait_applied(tmp_path, 3, workers=2, timeout_s=0.2)
    live.ack(tmp_path, 1, 3, error="loading m version 2 failed: boom")
    with pytest.raises(live.LiveError, match=r"worker 1 could not apply the change: .*boom"):
        live.wait_applied(tmp_path, 3, workers=2, timeout_s=5)
    live.ack(tmp_path, 1, 3)
    live.wait_applied(tmp_path, 3, workers=2, timeout_s=5)
    live.clear(tmp_path)
    assert live.read(tmp_path) is None and not (tmp_path / live.FOLDER).exists()


def test_stats_are_summed_over_the_workers(tmp_path: Path) -> None:
    a, b = live.Tally(), live.Tally()
    a.add(1.0, ok=True)
    b.add(3.0, ok=False)
    live.write_stats(tmp_path, 0, {("m", 2): a})
    live.write_stats(tmp_path, 1, {("m", 2): b, ("m", 1): a})
    total = live.read_stats(tmp_path)
    assert (total["m", 2].requests, total["m", 2].failed, total["m", 1].requests) == (2, 1, 1)


def test_a_restarted_worker_starts_with_the_live_versions_not_the_configured_one() -> None:
    configured = [ServedExport("m", "/v1", "onnx", version=1), ServedExport("n", "/n", "onnx")]
    fresh = initial(configured, None)
    assert [e.version for e in fresh["m"][1]] == [1] and fresh["n"][0].default == 1
    rolled = live.LiveState(
        5,
        {"m": live.ModelVersions({1: live.Loaded(1, "/v1", "onnx"), 2: live.Loaded(2, "/v2", "onnx")}, 1, 2, 10.0)},
    )  # fmt: skip
    wanted, exports = initial(configured, rolled)["m"]
    assert (wanted.canary, [(e.version, e.export_dir) for e in exports]) == (
        2,
        [(1, "/v1"), (2, "/v2")],
    )


def test_rollout_options_are_checked_before_anything_moves() -> None:
    with pytest.raises(PipelineError, match="--version N"):
        RolloutConfig("m", Path("run")).validate()
    with pytest.raises(PipelineError, match="--promote takes no --version"):
        RolloutConfig("m", Path("run"), version=2, promote=True).validate()
    with pytest.raises(PipelineError, match="between 0 and 100"):
        RolloutConfig("m", Path("run"), version=2, canary=100).validate()


def test_status_says_versions_default_and_canary() -> None:
    found = {
        "run_dir": "run",
        "server": {"runtime": "kserve", "pid": 7, "url": "http://127.0.0.1:8080", "models": {
            "m": {"versions": [1, 2], "default": 1, "canary": 2, "canary_percent": 20.0}}},
        "store": {"m": {"versions": [1, 2], "default": 1, "history": []}},
    }  # fmt: skip
    assert status_lines(found) == [
        "kserve (pid 7) at http://127.0.0.1:8080",
        "  m: versions 1, 2; default 1, canary 2 at 20%",
        "store: m versions 1, 2; default 1",
    ]
    assert not troubled(found)
    found["server"]["models"]["m"] |= {"ready": False, "why": "no replica"}
    assert troubled(found) and status_lines(found)[1].endswith("; NOT READY: no replica")


def test_status_of_a_server_that_exited_on_its_own_says_why_from_its_log(
    tmp_path: Path,
) -> None:
    """A KServe runtime whose worker could not load its model again stops every worker
    and exits (its supervisor's crash-loop rule): status names it and quotes its log."""
    import subprocess
    import sys

    from pipeline.serving.server import Server
    from pipeline.serving.status import status

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    Server(runtime="kserve", pid=int(gone.stdout), run_dir=str(run_dir),
           inference_url="http://127.0.0.1:1", metrics_url="", models=["m"],
           markers=["kserve.json"]).record()  # fmt: skip
    (run_dir / "logs" / "kserve.out").write_text(
        "2026-11-28 15:23:47,753 INFO supervisor started 1 worker(s): pids [24577]\n"
        "2026-11-28 15:23:48,951 ERROR pipeline.runtimes.kserve Refused: the version in "
        "/s/m/1 changed since it was signed (model.onnx differs from the signed bytes).\n"
        "2026-11-28 15:23:49,366 ERROR supervisor worker 0 died 3 times within 60 s; "
        "stopping every worker\n"
        "error: worker 0 died 3 times within 60 s\n"
    )
    found = status(run_dir, tmp_path / "store")
    assert found["server"] is None and found["exited"]["pid"] == int(gone.stdout)
    assert troubled(found)  # `pipeline status` exits 1 for scripts (it exited 0)
    lines = status_lines(found)
    assert lines[0].startswith(f"no server is running from {run_dir}: the kserve server (pid ")
    assert "exited without `pipeline stop`; its log (" in lines[0], lines
    assert "model.onnx differs from the signed bytes" in lines[1], lines
    assert lines[3] == "  error: worker 0 died 3 times within 60 s", lines
    # TorchServe's java killed: its gateway said only a warning, and it still runs.
    gateway = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                str(run_dir / "kserve.json")], start_new_session=True)  # fmt: skip
    try:
        server = Server.load(run_dir)
        server.pids["gateway"] = gateway.pid
        server.record()
        (run_dir / "logs" / "gateway.log").write_text(
            "2026-11-28 16:24:02,525 INFO aiohttp.access: POST /predictions/m 200\n"
            "2026-11-28 16:24:05,767 WARNING gateway: worker process(es) [1173] died\n"
        )
        lines = status_lines(status(run_dir, tmp_path / "store"))
        assert (
            lines[1] == "  2026-11-28 16:24:05,767 WARNING gateway: worker process(es) [1173] died"
        )
        assert lines[2] == f"  still running from it: pid {gateway.pid} (`pipeline stop` ends them)"
    finally:
        gateway.kill()
        gateway.wait()
    # Stopped by `pipeline stop` (no record left): nothing more to say.
    (run_dir / "server.json").unlink()
    found = status(run_dir, tmp_path / "store")
    assert status_lines(found) == [f"no server is running from {run_dir}"]
    assert not troubled(found)


def test_follow_applies_each_new_state_once_and_acknowledges_it(tmp_path: Path) -> None:
    import asyncio

    seen: list[int] = []
    tallies = {("m", 1): live.Tally()}

    async def apply(state: live.LiveState) -> str | None:
        seen.append(state.generation)
        if state.generation == 2:
            raise RuntimeError("no such file")
        return None

    async def scenario() -> None:
        task = asyncio.ensure_future(live.follow(tmp_path, 3, tallies, apply, poll_s=0.01,
                                                 stats_every_s=0))  # fmt: skip
        one = live.ModelVersions({1: live.Loaded(1, "/a", "onnx")}, 1)
        for generation in (1, 2):
            live.write(tmp_path, live.LiveState(generation, {"m": one}))
            await asyncio.sleep(0.1)
        tallies["m", 1].add(2.0, ok=True)
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(scenario())
    assert seen == [1, 2]  # each state once, though polled many times
    acked = live.acks(tmp_path)[3]
    assert acked["generation"] == 2 and "RuntimeError: no such file" in acked["error"]
    assert live.read_stats(tmp_path)["m", 1].requests == 1


def test_a_state_is_acknowledged_only_once_the_tallies_it_left_are_written(
    tmp_path: Path,
) -> None:
    """A version loaded again starts with no answers; its stats file kept the previous
    incarnation's for up to stats_every_s after the acknowledgement, and a rollout judged
    the new canary on them (CI: a canary with no traffic showed an earlier test's answers)."""
    import asyncio

    tallies = {("m", 2): live.Tally()}
    tallies["m", 2].add(1.0, ok=True)

    async def apply(state: live.LiveState) -> str | None:
        tallies.pop(("m", 2), None)  # as a worker does for a version it loads again
        return None

    async def scenario() -> None:
        task = asyncio.ensure_future(live.follow(tmp_path, 0, tallies, apply, poll_s=0.01,
                                                 stats_every_s=60))  # fmt: skip
        await asyncio.sleep(0.05)
        assert live.read_stats(tmp_path)["m", 2].requests == 1  # the first write
        two = live.ModelVersions({2: live.Loaded(2, "/b", "onnx")}, 2)
        live.write(tmp_path, live.LiveState(1, {"m": two}))
        for _ in range(100):
            if live.acks(tmp_path).get(0, {}).get("generation") == 1:
                break
            await asyncio.sleep(0.01)
        assert ("m", 2) not in live.read_stats(tmp_path)
        task.cancel()

    asyncio.run(scenario())


def test_a_restarted_worker_keeps_its_predecessor_s_answers_of_the_same_state(
    tmp_path: Path,
) -> None:
    """A KServe worker killed mid-canary came back writing empty tallies over its file:
    `rollout --promote` then said the canary "answered 0 of the 20 requests" (and any
    failures it had counted were gone). The same state's answers are carried over; after
    a state that changed while it was down, they are not."""
    import asyncio

    one = live.ModelVersions({1: live.Loaded(1, "/a", "onnx"), 2: live.Loaded(2, "/b", "onnx")}, 1)
    earlier = live.Tally()
    for ok in (True, True, False):
        earlier.add(1.0, ok=ok)

    async def apply(state: live.LiveState) -> str | None:
        return None

    async def restart(generation: int) -> dict[tuple[str, int], live.Tally]:
        live.clear(tmp_path)
        live.write(tmp_path, live.LiveState(5, {"m": one}))
        live.ack(tmp_path, 0, 5)  # what the dead process had applied and counted
        live.write_stats(tmp_path, 0, {("m", 2): earlier})
        live.write(tmp_path, live.LiveState(generation, {"m": one}))
        tallies: dict[tuple[str, int], live.Tally] = {}
        dead = live.acks(tmp_path)[0]["at"]
        task = asyncio.ensure_future(live.follow(tmp_path, 0, tallies, apply, poll_s=0.01))
        for _ in range(200):
            if live.acks(tmp_path)[0]["at"] != dead:  # acknowledged by the new process
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return tallies

    kept = asyncio.run(restart(5))
    assert (kept["m", 2].requests, kept["m", 2].failed) == (3, 1)
    assert live.read_stats(tmp_path)["m", 2].requests == 3  # written, not emptied
    assert ("m", 2) not in asyncio.run(restart(6))  # another state: counted afresh


def test_status_names_a_dead_gateway_of_a_running_server(tmp_path: Path) -> None:
    """`kill -9` of TorchServe's gateway: status said the server was fine (exit 0) while
    every request got "connection refused"; only the main process was checked."""
    import subprocess
    import sys

    from pipeline.serving.server import Server
    from pipeline.serving.status import status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    main = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             str(run_dir / "config.properties")], start_new_session=True)  # fmt: skip
    try:
        Server(runtime="torchserve", pid=main.pid, run_dir=str(run_dir),
               inference_url="http://127.0.0.1:1", metrics_url="", models=[],
               pids={"gateway": int(gone.stdout)},
               markers=["config.properties"]).record()  # fmt: skip
        found = status(run_dir, tmp_path / "store")
        assert found["server"]["exited"] == {"gateway": int(gone.stdout)}
        lines = status_lines(found)
        assert lines[1] == (
            f"  its gateway (pid {int(gone.stdout)}) exited: requests to http://127.0.0.1:1 "
            "find no one; `pipeline stop`, then `pipeline serve` again"
        ), lines
        assert troubled(found)
    finally:
        main.kill()
        main.wait()


def test_a_deploy_of_the_working_export_warns_when_the_store_serves_another(
    tmp_path: Path,
) -> None:
    """After a rollback to version 1, `deploy kserve` packed the working export (version 2's
    weights) while `pipeline serve` served version 1, and said nothing."""
    from tests.unit.test_served_freshness import NEW, _manifest

    store, model = tmp_path / "store", "digits_lenet"
    for number, sha in ((1, "a1"), (2, "b2")):
        folder = store / model / str(number)
        folder.mkdir(parents=True)
        (folder / versions.PROVENANCE).write_text("{}")
        (folder / "manifest.json").write_text(_manifest(sha, "c", NEW).dumps())
    versions.write_pointer(model, versions.Pointer(1, [2]), store)
    work = tmp_path / "export"
    work.mkdir()
    (work / "manifest.json").write_text(_manifest("b2", "c", NEW).dumps())
    assert versions.not_the_default(model, work, store) == (
        f"{work} is not version 1 of {model}, the store's default that `pipeline serve` "
        f"serves; to deploy that one, pass --export-dir {store / model / '1'}"
    )
    versions.write_pointer(model, versions.Pointer(2, []), store)
    assert versions.not_the_default(model, work, store) is None  # the same artifacts
    assert versions.not_the_default(model, work, tmp_path / "none") is None  # no store


def test_a_new_version_number_skips_every_numbered_folder_and_no_other_name_breaks_it(
    tmp_path: Path,
) -> None:
    # A folder "²" passed isdigit() and failed int(): publish died with a ValueError.
    for name in ("1", "03", "²", "٣", "x7", ".4.staging"):
        (tmp_path / name).mkdir()
    assert versions.next_number(tmp_path) == 4
    assert versions.next_number(tmp_path / "03") == 1


def test_a_device_index_is_ascii_digits() -> None:
    from pipeline.core.errors import ArtifactError
    from pipeline.serving.loading import check_device

    check_device("cuda:1")
    for device in ("cuda:²", "cuda:", "cuda:-1", "gpu"):  # "²" passed isdigit(), failed int()
        with pytest.raises(ArtifactError, match="use auto, cpu, cuda or cuda:N"):
            check_device(device)


def test_rollout_and_status_take_the_running_servers_store_when_none_is_given(
    tmp_path: Path,
) -> None:
    # `serve --store S` then `rollout` without --store was refused ("--store model_store
    # is another one") and `status` showed no store: they now read the server's record.
    from pipeline.cli import build_parser
    from pipeline.cli.args import running_store as _store
    from pipeline.core.paths import DEFAULT_STORE
    from pipeline.serving.server import Server

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # loadtest --by-version too: it judged by model_store's versions (a user's trial).
    COMMANDS = (["status"], ["rollback", "--model", "m"], ["rollout", "--model", "m"],
                ["loadtest", "--model", "m", "--by-version"])  # fmt: skip
    parser = build_parser()
    for argv in COMMANDS:
        args = parser.parse_args([*argv, "--run-dir", str(run_dir)])
        assert _store(args) == DEFAULT_STORE  # no server recorded there
    Server(
        runtime="kserve", pid=0, run_dir=str(run_dir), inference_url="", metrics_url="",
        models=["m"], extras={"store": str(tmp_path / "mine")},
    ).record()  # fmt: skip
    for argv in COMMANDS:
        args = parser.parse_args([*argv, "--run-dir", str(run_dir)])
        assert _store(args) == tmp_path / "mine", argv
        given = parser.parse_args([*argv, "--run-dir", str(run_dir), "--store", "other"])
        assert _store(given) == Path("other")


def test_a_served_user_model_is_listed_once_with_its_store_folder(tmp_path: Path) -> None:
    # status listed "mine/textclf.py:TextClassifier" (served) and "textclf_TextClassifier"
    # (its store folder) as two models (a user's trial).
    from pipeline.serving.status import stored_models

    store = tmp_path / "store"
    for name in ("textclf_TextClassifier", "other"):
        (store / name).mkdir(parents=True)
        versions.write_pointer(name, versions.Pointer(1, []), store)
    (store / "trust").mkdir()  # not a model
    assert stored_models(store, {"mine/textclf.py:TextClassifier"}) == {"other"}
    assert stored_models(store, set()) == {"other", "textclf_TextClassifier"}
    assert stored_models(tmp_path / "none", set()) == set()
