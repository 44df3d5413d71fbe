"""`python -m pipeline ARGS` forked from an interpreter that has imported torch already.

A full run of the suite on the 2-core machine spent about a third of its CPU time in
`python -m pipeline` processes (760 of 2,230 s, 190 processes, sampled from /proc), and
each one began with the same 3 to 4 s of `import torch`. `run_cli` (tests/conftest.py)
sends a command here instead: one process per xdist worker imports torch once, then
forks a child per command. The child is the command's own process, as a fresh one
would be: its arguments, working folder (first on sys.path, as `-m` puts it), standard
streams written to files, `pipeline/__main__.py` run as `__main__`, its exit status
and atexit handlers. Before the fork the process imports torch and the third-party
modules most commands import next (PREIMPORTED: torch.export and Dynamo, ONNX's
exporter, torchvision), never the pipeline's own code, so every pipeline module reads
the environment when the command imports it.

What a fork cannot give is an environment of the command's own at interpreter start
(PYTHONPATH's sitecustomize, OMP_NUM_THREADS as the OpenMP runtime reads it when
loaded): a command given variables of its own (beyond RUNTIME_ONLY's) runs as a plain
subprocess, as does every command with PIPELINE_TESTS_NO_FORK=1 in the environment.
When the test process's own environment changes, the forking process is replaced by
one started with the new environment. The console script itself, as a user starts it, is run by the e2e
tests (test_cli's help check, the README walkthrough, the own-model page).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The forking process: imports torch, then forks a child per request line and answers
# with the child's pid, then its exit status and CPU seconds.
_SOURCE = r"""
import importlib, json, os, runpy, sys
import torch  # what every command would import first

# What most commands import next (export, verify): about 2 s of CPU a command, paid here
# once. Third-party modules only, none of the pipeline's own, and not onnxruntime, whose
# import starts a thread of its own that a fork would not carry into the child.
for name in PREIMPORTED:
    importlib.import_module(name)

def child(req):
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(os.devnull)  # not the request pipe, nor what was read ahead of it
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[0] = os.getcwd()  # where `python -m` puts the working folder
    sys.argv = ["-m", *req["args"]]
    runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
    raise SystemExit(0)

answer = sys.stdout
answer.write("ready\n")
answer.flush()
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)  # exits the interpreter as the command's own process would
    answer.write(f"{pid}\n")
    answer.flush()
    _, status, usage = os.wait4(pid, 0)
    answer.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime}\n")
    answer.flush()
"""


# Modules the forking process imports after torch (see _SOURCE).
PREIMPORTED = ("torch.export", "torch._dynamo", "torch.distributed.tensor", "torch.onnx",
               "onnx", "onnxscript", "torchvision")  # fmt: skip
_SOURCE = _SOURCE.replace("PREIMPORTED", repr(PREIMPORTED))


def command(args: list[str]) -> list[str]:
    """The command line a plain run starts, and the one a forked run reports."""
    return [sys.executable, "-m", "pipeline", *args]


class Forker:
    """One forking process, started with `env`; `run` sends it one command at a time."""

    cpu_s = 0.0  # CPU time of every command forked in this process (tests/timing.py reads it)

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=tempfile.gettempdir(),
        )
        self.lock = threading.Lock()
        self.pending = b""
        self.reported = 0.0  # the CPU of its commands, as counted into cpu_s
        if self._line(timeout=600) != "ready":
            raise RuntimeError("the forking CLI process did not start")

    def _line(self, timeout: float | None) -> str | None:
        """The next line it wrote, None on timeout (raw reads: a buffered reader would
        hold a second line that select() then never reports)."""
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the forking CLI process exited")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def run(
        self, args: list[str], cwd: Path | None, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="cli-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"args": args, "cwd": str(cwd or os.getcwd()), "env": env,
                       "stdout": str(out), "stderr": str(err)}  # fmt: skip
            self.proc.stdin.write((json.dumps(request) + "\n").encode())  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            pid = int(self._line(timeout=60) or 0)
            answer = self._line(timeout=timeout)
            if answer is None:
                os.kill(pid, 9)
                self._line(timeout=60)  # its status, once reaped
                raise subprocess.TimeoutExpired(command(args), timeout)
            code, cpu = answer.split()
            Forker.cpu_s += float(cpu)
            self.reported += float(cpu)
            return subprocess.CompletedProcess(
                command(args),
                int(code),
                out.read_text(errors="replace"),
                err.read_text(errors="replace"),
            )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Reaped, it brings its own CPU and its commands' (it waited for them) into this
        # process's RUSAGE_CHILDREN; the commands' were counted as they ended.
        Forker.cpu_s -= self.reported
        self.reported = 0.0


_forker: Forker | None = None
# Variables a test worker gains as it runs, which nothing reads when an interpreter or
# torch starts: the child gets them (its environment is the command's, exactly) and a
# fork serves. pytest's current test; pipeline.core.seeding's cuBLAS setting (read when
# CUDA starts); sklearn's OpenMP settings (sklearn sets them itself when imported);
# Inductor's cache folder (read when torch._inductor is imported); the input checks a
# .pt2 package's compiled code reads when it first runs, which loading one sets (without
# it in the list, every command after a worker's first .pt2 ran as a plain subprocess).
RUNTIME_ONLY = frozenset(
    {"PYTEST_CURRENT_TEST", "CUBLAS_WORKSPACE_CONFIG", "KMP_DUPLICATE_LIB_OK",
     "KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR", "AOTI_RUNTIME_CHECK_INPUTS"}
)  # fmt: skip
OFF = "PIPELINE_TESTS_NO_FORK"  # =1: every command as a plain subprocess (to compare, debug)


def run(
    args: list[str], cwd: Path | None, env: dict[str, str], base: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python -m pipeline ARGS` in `cwd` with exactly `env`: forked when `env` is this
    test process's environment `base` (beyond RUNTIME_ONLY's variables), else a plain
    subprocess. The forking process starts with `base`; when `base` has changed since
    (a test worker's environment drifts as its tests run: a library sets a variable),
    it is closed and a new one started, one interpreter start for all the commands after."""
    global _forker
    if os.environ.get(OFF) == "1" or _differs(env, base):
        return subprocess.run(
            command(args), capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
        )
    if _forker is not None and _differs(base, _forker.env):
        _forker.close()
        _forker = None
    if _forker is None:
        _forker = Forker(base)
    return _forker.run(args, cwd, env, timeout)


def _differs(a: dict[str, str], b: dict[str, str]) -> set[str]:
    """The variables, beyond RUNTIME_ONLY, whose values differ between `a` and `b`."""
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} - RUNTIME_ONLY


@atexit.register
def _close() -> None:
    if _forker is not None:
        _forker.close()
