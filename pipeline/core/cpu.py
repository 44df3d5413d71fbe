"""What this machine's CPU is: its model name, the instruction sets a compiled package or
a measurement depends on (read from /proc/cpuinfo) and the cores this process may use; no
torch."""

from __future__ import annotations

import os
import platform

import psutil

FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpuinfo() -> tuple[str, list[str]]:
    """The CPU's model name and which of FLAGS_OF_INTEREST it has."""
    model, flags = platform.processor() or "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("unknown", "x86_64", ""):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value.split()
    except OSError:
        pass
    return model, [f for f in FLAGS_OF_INTEREST if f in flags]


def cpu_model() -> str:
    """The CPU's model name (what a measurement of this machine is only valid on)."""
    return cpuinfo()[0]


def cores() -> int:
    """The cores this process may run on (its affinity, which a container's cpuset limits)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return psutil.cpu_count() or 1
