"""What the suite's CPU goes to, by kind of process: `make test-cpu` (`--cpu-profile`).

On a 2-core machine the suite keeps both cores busy, so its wall time is its CPU work,
and most of that work is not in the pytest workers: it is in the commands, servers,
compilers and clusters they start. Worker time per module (tests/timing.py) cannot see
a daemonised TorchServe or a Ray node. This plugin samples every process on the machine
from /proc (utime + stime, every SAMPLE_S) on the controller while the run lasts,
sorts each process into a kind by its command line, and prints CPU-seconds and process
counts per kind beside the machine's busy and idle CPU-seconds (/proc/stat).
`.pytest_cache/cpu_profile.json` keeps the table and the 40 costliest processes.

A process that lives less than SAMPLE_S is missed; the gap between the machine's busy
time and the kinds' sum says how much that was. Linux only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

RESULT = Path(".pytest_cache") / "cpu_profile.json"
SAMPLE_S = 0.25
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# By the process's own name first (compilers and the JVM are named for what they are).
NAMED: dict[str, str] = {
    **dict.fromkeys(("cc1plus", "cc1", "as", "ld", "ld.bfd", "ld.gold", "collect2", "c++",
                     "g++", "gcc", "nvcc", "cudafe++", "cicc", "ptxas", "fatbinary"),
                    "C++ compilers (client builds, AOTInductor)"),
    **dict.fromkeys(("run_torchscript", "pte_runner"), "C++ clients (LibTorch, ExecuTorch)"),
    **dict.fromkeys(("cmake", "make", "gmake", "ninja"), "build tools (cmake, make)"),
    "java": "TorchServe JVMs",
    **dict.fromkeys(("raylet", "gcs_server"), "Ray cluster (nodes, Serve actors)"),
}  # fmt: skip

# Then (kind, any of these in the command line), first match wins.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pipeline commands, forked (tests/cli_fork.py)", ("what every command would import first",)),
    ("pytest workers (in-process tests)", ("exec(eval(sys.stdin.readline()))", "execnet")),
    ("pytest controller", ("-m pytest",)),
    ("KServe runtime servers", ("pipeline.runtimes.kserve",)),
    ("Ray cluster (nodes, Serve actors)", ("pipeline.runtimes.ray", "ray::", "/site-packages/ray/")),
    ("TorchServe Python workers", ("model_service_worker",)),
    ("TorchServe gateways (pipeline's, in front of it)", ("pipeline.runtimes.torchserve",)),
    ("DDP training ranks (torchrun's)", ("-u -m pipeline",)),
    ("multiprocessing children (KServe workers)", ("multiprocessing",)),
    ("torchrun launchers", ("torchrun",)),
    ("pipeline commands (plain subprocesses, console script)", ("-m pipeline", "bin/pipeline")),
    ("toy runtimes (tests)", ("tests.toy_runtime",)),
    ("other Python", ("python",)),
)  # fmt: skip


def kind_of(command: str, name: str) -> str:
    if name in NAMED:
        return NAMED[name]
    if name.startswith("ray::"):
        return NAMED["raylet"]
    for kind, needles in KINDS:
        if any(n in command for n in needles):
            return kind
    return f"other ({name})"


def _machine() -> tuple[int, int]:
    """Busy and idle clock ticks of the whole machine since boot."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return sum(ticks[:3]) + sum(ticks[5:8]), ticks[3] + ticks[4]


class Sampler:
    def __init__(self) -> None:
        self.procs: dict[
            str, list
        ] = {}  # "pid:start" -> [ticks now, ticks at first sight, command, name]
        self.first = True
        self.stop = threading.Event()
        self.busy0, self.idle0 = _machine()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="cpu-profile", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self._sample()
            self.first = False
            self.stop.wait(SAMPLE_S)

    def _sample(self) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            close = stat.rfind(")")
            name, fields = stat[stat.find("(") + 1 : close], stat[close + 2 :].split()
            ticks, key = int(fields[11]) + int(fields[12]), f"{pid}:{fields[19]}"
            known = self.procs.get(key)
            if known is None:
                # A process running before the run counts from here; a new one from 0.
                known = self.procs[key] = [ticks, ticks if self.first else 0, "", name]
            if not known[2] and ticks > known[1]:  # read once it has worked (after exec)
                known[2] = _command(pid)
            known[0], known[3] = ticks, name

    def finish(self) -> dict:
        self.stop.set()
        self.thread.join(timeout=5)
        busy, idle = _machine()
        seconds, counts = Counter(), Counter()
        costly = []
        for ticks, base, command, name in self.procs.values():
            used = (ticks - base) / HZ
            if used <= 0:
                continue
            kind = kind_of(command, name)
            seconds[kind] += used
            counts[kind] += 1
            costly.append((round(used, 1), kind, command[:160] or f"[{name}]"))
        return {
            "wall_s": round(time.monotonic() - self.started, 1),
            "cores": os.cpu_count(),
            "busy_cpu_s": round((busy - self.busy0) / HZ, 1),
            "idle_cpu_s": round((idle - self.idle0) / HZ, 1),
            "kinds": [
                {"kind": k, "cpu_s": round(s, 1), "processes": counts[k]}
                for k, s in seconds.most_common()
            ],
            "costliest": sorted(costly, reverse=True)[:40],
        }


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            # Arguments are NUL-separated; a -c program's own lines are joined too.
            return " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())[:400]
    except OSError:
        return ""


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-profile",
        action="store_true",
        help="sample every process's CPU time from /proc and print it by kind (make test-cpu)",
    )


def register(config: pytest.Config) -> None:
    """On the controller only: it sees the whole machine, and the workers come and go."""
    if config.getoption("--cpu-profile") and not hasattr(config, "workerinput"):
        if not Path("/proc/stat").exists():
            raise pytest.UsageError("--cpu-profile reads /proc: Linux only")
        config.pluginmanager.register(Report(Sampler()), "cpu-profile")


class Report:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        found = self.sampler.finish()
        RESULT.parent.mkdir(exist_ok=True)
        RESULT.write_text(json.dumps(found, indent=1))
        write = terminalreporter.write_line
        terminalreporter.section("CPU by kind of process (--cpu-profile)")
        busy, idle, wall = found["busy_cpu_s"], found["idle_cpu_s"], found["wall_s"]
        write(
            f"machine: {busy:.0f} CPU-s busy, {idle:.0f} idle in {wall:.0f} s on "
            f"{found['cores']} cores ({busy / max(wall, 1e-9):.2f} cores busy on average)"
        )
        sampled = sum(k["cpu_s"] for k in found["kinds"])
        for k in found["kinds"]:
            if k["cpu_s"] >= 0.5:
                write(f"{k['cpu_s']:8.1f} CPU-s {k['processes']:5d} processes  {k['kind']}")
        write(
            f"{sampled:8.1f} CPU-s sampled; the rest of the busy time ({busy - sampled:.0f} s) "
            f"is processes shorter than {SAMPLE_S} s and the kernel. Written to {RESULT}."
        )
