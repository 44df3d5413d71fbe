"""`pipeline stop` waits for a server's processes to end, not for their zombies to be
reaped: a daemonised server's processes are PID 1's children once its launcher exits,
and in a container PID 1 may reap them seconds later (TorchServe's stop in the suite
took 7 s with those waits, 4 s without)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pipeline.serving.launcher import _group_alive, _running_in_group

# A parent that starts a child in a group of its own, prints its pid, never reaps it.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_group_of_zombies_another_process_has_not_reaped_is_not_running() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while _running_in_group(child) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exited: a zombie of `parent`
        os.killpg(child, 0)  # the group still exists (the zombie is in it)...
        assert _running_in_group(child) is False
        assert not _group_alive(child)  # ...and nothing of it runs
    finally:
        parent.kill()
        parent.wait()


def test_a_running_group_is_alive_until_it_ends() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        assert _running_in_group(proc.pid) is True and _group_alive(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not _group_alive(proc.pid)
