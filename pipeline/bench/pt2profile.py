"""Where a `.pt2` package's time goes inside one call: torch.profiler's view of it.

The package's own generated kernels are not operators the profiler names, but what it
calls out to is: oneDNN's convolutions (`aten::mkldnn_convolution`), the `aten::item`
reads a scan's loop makes at each step. bench profiles the package once per model and
batch, after its timed rounds, and a missed `.pt2` target quotes the top operators.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

CALLS = 50
TOP = 3


def top_ops(measure: Callable[[int, int], Any], calls: int = CALLS, top: int = TOP) -> str:
    """The operators with the most self CPU time over `calls` calls of `measure`, as one
    line ("" when the profiler cannot run here)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # kineto's start/stop lines: not ours
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            measure(0, calls)
    except Exception as err:  # noqa: BLE001 - a profile is an extra: say so, go on
        log.warning("no .pt2 profile: %s: %s", type(err).__name__, err)
        return ""
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    if not events or total <= 0:
        return ""
    parts = [
        f"{e.key} {100 * e.self_cpu_time_total / total:.0f}% ({e.count / calls:g} a call)"
        for e in events[:top]
    ]
    return f"torch.profiler's top operators, self CPU over {calls} calls: {', '.join(parts)}"
