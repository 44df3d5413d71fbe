"""Bench's peers on their own: real servers on 127.0.0.1, a few requests, always stopped.

The quick bench (test_bench.py) shows the rows and target lines in bench.md;
these check the peer phase itself: every peer answers right (its first answer is
checked against eager before anything is timed), is measured at concurrency 1 and
8 with no failed request, and leaves no process behind.
"""

from __future__ import annotations

import importlib.util

import psutil
import pytest

from pipeline.bench.peers import LITSERVE, YARDSTICK, PeerRun, bench_peers
from pipeline.export import ExportResult
from pipeline.export.opened import open_export

HAS_LITSERVE = importlib.util.find_spec("litserve") is not None


def _peer_processes() -> list[psutil.Process]:
    """Our children still running a peer script."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any(part.endswith("_server.py") for part in child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.fixture(scope="module")
def peer_run(exported: ExportResult) -> PeerRun:
    # runtimes=(): the peers alone (our runtime's row is the quick bench's); a few
    # requests a level: the shape, never the speed.
    return bench_peers(
        "digits_lenet",
        open_export(exported.out_dir),
        runtimes=(),
        requests=12,
        level_budget_s=2.0,
        rounds=1,
    )


def _rows(run: PeerRun, label: str) -> set[tuple[str, int]]:
    return {(p.batching, p.concurrency) for p in run.points if p.backend == f"{label}/onnx"}


def test_the_yardstick_is_measured_at_both_levels_and_stopped(peer_run: PeerRun) -> None:
    assert _rows(peer_run, YARDSTICK) == {("off", 1), ("off", 8)}
    for p in peer_run.points:
        assert p.failed == 0 and p.requests >= 12 and p.throughput > 0, p
        assert 0 < p.median_ms <= p.p90_ms <= p.p99_ms
    assert peer_run.ours == []  # none asked for
    assert _peer_processes() == []


@pytest.mark.skipif(not HAS_LITSERVE, reason="litserve is not installed (the `bench` extra)")
def test_litserve_is_measured_with_batching_off_and_on(peer_run: PeerRun) -> None:
    assert _rows(peer_run, LITSERVE) == {("off", 1), ("off", 8), ("on", 1), ("on", 8)}
    on = peer_run.settings["litserve/onnx on"]
    assert on["workers"] == 1 and "--max-batch-size 8" in on["args"]
    assert not [s for s in peer_run.skipped if s["backend"].startswith(LITSERVE)]


@pytest.mark.skipif(HAS_LITSERVE, reason="litserve is installed: its rows are checked instead")
def test_without_litserve_the_run_says_why_in_one_line(peer_run: PeerRun) -> None:
    (why,) = [s["why"] for s in peer_run.skipped if s["backend"] == "litserve/onnx"]
    assert "not installed" in why and "\n" not in why
    assert _rows(peer_run, LITSERVE) == set()
