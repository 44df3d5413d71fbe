"""Issue 42: bench's AOTInductor settings sweep and export's reading of it, in process
(results made here; the compiles themselves run in `make bench`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.bench.pt2settings import CANDIDATES, DEFAULT, best_of, markdown, write
from pipeline.core import paths
from pipeline.core.pt2settings import SETTINGS_FILE, for_export
from pipeline.export.config import _pt2_settings
from pipeline.formats.base import ExportContext
from pipeline.formats.pt2 import INDUCTOR_CONFIGS, settings_record

STACK = "stack allocation"


def _found(times: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """One model's sweep: settings → (batch 1, batch 32) medians in ms."""
    points = [
        {"settings": name, "batch": batch, "median_ms": ms}
        for name, pair in times.items()
        for batch, ms in zip((1, 32), pair, strict=True)
    ]
    return {"points": points, "compile_s": dict.fromkeys(times, 15.0), "failed": {}}


def test_the_best_must_beat_the_built_in_settings_by_more_than_a_tie() -> None:
    faster = {"gate": _found({DEFAULT: (0.004, 0.004), STACK: (0.003, 0.004)})}
    assert best_of(faster) == STACK  # (1.33 + 1.0) / 2 = 1.17
    tie = {"gate": _found({DEFAULT: (0.004, 0.004), STACK: (0.0039, 0.004)})}
    assert best_of(tie) == DEFAULT  # 1.3%: within the tie
    # Averaged over models: faster on one, slower on the other by more.
    mixed = {**faster, "cnn": _found({DEFAULT: (0.08, 0.4), STACK: (0.12, 0.6)})}
    assert best_of(mixed) == DEFAULT
    # A candidate that failed to compile on one model is not chosen.
    partial = {**faster, "cnn": _found({DEFAULT: (0.08, 0.4)})}
    assert best_of(partial) == DEFAULT


def test_export_compiles_with_bench_s_settings_on_this_machine_only(tmp_path: Path) -> None:
    configs, why = for_export(tmp_path)
    assert configs == {} and "no settings sweep" in why
    write(tmp_path, {"gate": _found({DEFAULT: (0.004, 0.004), STACK: (0.003, 0.004)})})
    configs, why = for_export(tmp_path)
    assert configs == CANDIDATES[STACK] and "bench's sweep on this machine" in why
    assert STACK in markdown(tmp_path) and "1.33×" in markdown(tmp_path)

    art = tmp_path / "art"  # the CLI's --artifacts-dir, whose bench folder holds the sweep
    assert _pt2_settings(art) == {
        "changes": {},
        "from": for_export(paths.bench_dir(art))[1],
    }
    write(paths.bench_dir(art), {"gate": _found({DEFAULT: (0.004, 0.004), STACK: (0.003, 0.004)})})
    assert _pt2_settings(art)["changes"] == CANDIDATES[STACK]
    ctx = ExportContext(None, {}, [], {}, tmp_path, pt2_settings={"changes": configs, "from": why})  # type: ignore[arg-type]
    record = settings_record(ctx)
    assert record["inductor_configs"] == {**INDUCTOR_CONFIGS, **CANDIDATES[STACK]}
    assert record["settings_from"] == why

    data = json.loads((tmp_path / SETTINGS_FILE).read_text())
    data["machine"] = {"cpu": "another", "cores": 64}
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(data))
    configs, why = for_export(tmp_path)
    assert configs == {} and "measured on another machine" in why
