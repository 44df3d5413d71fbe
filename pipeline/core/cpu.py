"""What this machine's CPU is: its model name and the instruction sets a compiled package or
a measurement depends on (read from /proc/cpuinfo; no torch)."""

from __future__ import annotations

import platform

FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def _cpuinfo() -> tuple[str, list[str]]:
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
    return _cpuinfo()[0]


def cpu_flags() -> list[str]:
    """The instruction sets of interest this CPU has (AVX2, AVX-512, AMX...)."""
    return _cpuinfo()[1]
