"""The KServe runtime's worker sweep: which counts bench tries, which it calls best, and
what `pipeline serve` takes from it (only a measurement of this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.runtimes.kserve import sweep
from pipeline.runtimes.kserve.config import default_workers


@pytest.mark.parametrize(
    ("cores", "expected"),
    [(1, [1]), (2, [1, 2]), (3, [1, 2]), (4, [1, 2, 3, 4]), (16, [1, 2, 4, 8]), (6, [1, 2, 4, 5])],
)
def test_candidates(cores: int, expected: list[int]) -> None:
    assert sweep.candidates(cores) == expected


def _point(workers: int, level: int, rps: float) -> dict:
    return {"workers": workers, "threads": 1, "concurrency": level, "throughput": rps,
            "median_ms": 1.0, "p99_ms": 2.0}  # fmt: skip


def test_best_weighs_every_level_and_ties_go_to_fewer_workers() -> None:
    # resnet18 in the stored run: a tie at 32, two workers 17% ahead at 8: two.
    points = [_point(1, 8, 44.0), _point(2, 8, 51.3), _point(1, 32, 51.2), _point(2, 32, 50.8)]
    assert sweep.best_of(points) == 2
    # digits: one worker ahead at both levels; 32's larger figures do not decide alone.
    points = [_point(1, 8, 1948), _point(2, 8, 1670), _point(1, 32, 2959), _point(2, 32, 2161)]
    assert sweep.best_of(points) == 1
    points = [_point(1, 8, 1000), _point(2, 8, 600), _point(1, 32, 1000), _point(2, 32, 1300)]
    assert sweep.best_of(points) == 1  # 0.88 against 0.73 of the best
    # Within 3% of the best score: the fewest workers (each holds a copy of every model).
    assert sweep.best_of([_point(1, 32, 1000), _point(2, 32, 1020)]) == 1
    assert sweep.best_of([_point(1, 32, 1000), _point(2, 32, 1020), _point(4, 32, 1500)]) == 4
    # A count that failed a level scores 0 there.
    assert sweep.best_of([_point(1, 8, 900), _point(1, 32, 1000), _point(2, 32, 1100)]) == 1


def _write(folder: Path, models: dict, machine: dict | None = None) -> None:
    data = {"machine": machine or sweep.machine(), "models": models}
    (folder / sweep.SWEEP_FILE).write_text(json.dumps(data))


def test_serve_takes_the_served_models_best_on_this_machine(tmp_path: Path) -> None:
    _write(tmp_path, {"digits_lenet": {"best": 3}, "torchvision:resnet18": {"best": 1}})
    choice = sweep.choose(tmp_path, ["torchvision:resnet18"])
    assert choice.workers == 1 and "for torchvision:resnet18" in choice.why
    # A model not swept: the most common best.
    _write(tmp_path, {"a": {"best": 2}, "b": {"best": 2}, "c": {"best": 5}})
    choice = sweep.choose(tmp_path, ["my_model"])
    assert choice.workers == 2 and "most common" in choice.why


def test_another_machines_sweep_or_none_falls_back_to_the_rule(tmp_path: Path) -> None:
    choice = sweep.choose(tmp_path, ["digits_lenet"])
    assert choice.workers == default_workers() and "no worker sweep" in choice.why
    other = {"cpu": "some other CPU", "cores": 64}
    _write(tmp_path, {"digits_lenet": {"best": 7}}, machine=other)
    choice = sweep.choose(tmp_path, ["digits_lenet"])
    assert choice.workers == default_workers() and "another machine" in choice.why
    (tmp_path / sweep.SWEEP_FILE).write_text("{not json")
    assert sweep.choose(tmp_path, ["digits_lenet"]).workers == default_workers()
    _write(tmp_path, {"digits_lenet": {"best": 0}, "x": {"best": "two"}})
    choice = sweep.choose(tmp_path, ["digits_lenet"])
    assert choice.workers == default_workers() and "holds no result" in choice.why


def test_write_merges_models_measured_here_and_drops_another_machines(tmp_path: Path) -> None:
    found = {"format": "onnx", "best": 1, "points": [_point(1, 8, 900.0), _point(2, 8, 850.0)]}
    _write(tmp_path, {"old": {"best": 9}}, machine={"cpu": "elsewhere", "cores": 1})
    sweep.write(tmp_path, {"digits_lenet": found})
    data = json.loads((tmp_path / sweep.SWEEP_FILE).read_text())
    assert list(data["models"]) == ["digits_lenet"]
    sweep.write(tmp_path, {"torchvision:resnet18": found | {"best": 2}})
    data = json.loads((tmp_path / sweep.SWEEP_FILE).read_text())
    assert set(data["models"]) == {"digits_lenet", "torchvision:resnet18"}
    md = sweep.markdown(tmp_path)
    assert "| digits_lenet | onnx | 1 × 1 | 8 | 900.0 | 1.00 | 2.00 | ◀ |" in md
    assert "| digits_lenet | onnx | 2 × 1 | 8 | 850.0 | 1.00 | 2.00 |  |" in md
    assert sweep.markdown(tmp_path / "none") == ""


def test_private_runtimes_start_with_the_sweeps_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench's peers and rows: KServe.private(PrivateSettings(tuned_in=...)) hands the runtime the count
    # `choose` gives and the threads shared out as serve shares them, unless told.
    import contextlib

    from pipeline.runtimes.kserve import launch
    from pipeline.runtimes.kserve.config import default_threads
    from pipeline.serving import runtime
    from pipeline.serving.capabilities import PrivateSettings

    started: list[dict] = []

    @contextlib.contextmanager
    def private(exports, **settings):  # what would start the runtime processes
        started.append(settings)
        yield None

    monkeypatch.setattr(launch, "private", private)
    monkeypatch.setattr(launch, "served_export", lambda *a, **k: None)
    exported = type("E", (), {"name": "digits_lenet", "dir": tmp_path, "manifest": None})()
    _write(tmp_path, {"digits_lenet": {"best": 3}})
    kserve = runtime.get("kserve")
    with kserve.private(exported, "onnx", PrivateSettings(tuned_in=tmp_path)):
        pass
    with kserve.private(exported, "onnx", PrivateSettings(tuned_in=tmp_path, workers=1)):
        pass
    with kserve.private(exported, "onnx"):
        pass
    assert started == [{"workers": 3, "threads": default_threads(3)}, {"workers": 1}, {}]
