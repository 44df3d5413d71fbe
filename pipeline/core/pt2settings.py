"""The AOTInductor settings `pipeline export` compiles `.pt2` with on this machine: the
ones bench's sweep chose here (pipeline/bench/pt2settings.py writes the file), else the
built-in ones (pipeline.formats.pt2.INDUCTOR_CONFIGS)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SETTINGS_FILE = "pt2_settings.json"


def machine() -> dict[str, Any]:
    """What a measurement holds on: the CPU, the instruction sets a package is compiled for
    (AVX2 on one reference machine, AVX-512 on the other, both "AMD EPYC") and the cores."""
    from pipeline.core.cpu import cores, cpuinfo

    model, flags = cpuinfo()
    return {"cpu": model, "flags": flags, "cores": cores()}


def for_export(bench_dir: Path) -> tuple[dict[str, Any], str]:
    """The changes to the built-in settings export compiles with here, and why."""
    path = Path(bench_dir) / SETTINGS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, f"the built-in settings: no settings sweep in {path} (`make bench` runs one)"
    if not isinstance(data, dict) or not isinstance(data.get("configs"), dict):
        return {}, f"the built-in settings: {path} holds no result"
    if data.get("machine") != machine():
        return {}, f"the built-in settings: {path} was measured on another machine"
    return dict(data["configs"]), f"bench's sweep on this machine ({data.get('best')}; {path})"
