"""A lost node's processes under the Ray runtime's host (pipeline/runtimes/ray/reaper.py).
After a node kill (a user's trial, 2026-11-29) the dead node's raylet, agents and replicas
stayed <defunct> until `pipeline stop`: the host, their subreaper, reaped only at the
stop. And a replica whose raylet alone was SIGKILLed kept running, orphaned (210 MB
each). No Ray here: a stand-in host (a child subreaper, as host.py makes itself) starts
a stand-in raylet with a worker of its own, and the raylet is SIGKILLed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

from pipeline.runtimes.ray import host

HOST = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    import psutil
    from types import SimpleNamespace
    from pipeline.runtimes.ray import host, reaper

    host._adopt_orphans()
    worker = "import time; time.sleep(120)"
    raylet = subprocess.Popen([sys.executable, "-c",
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); "
        "time.sleep(120)"])
    node = SimpleNamespace(node_id="n1", all_processes={
        "raylet": [SimpleNamespace(process=raylet)]})
    orphans = reaper.Orphans()
    deadline = time.monotonic() + 30
    while not orphans.seen.get("n1") and time.monotonic() < deadline:
        reaper.tend([node], orphans)  # the refresh, while the node lives
        time.sleep(0.05)
    worker_pid = min(orphans.seen["n1"])
    os.kill(raylet.pid, signal.SIGKILL)  # the raylet alone: its worker is adopted
    deadline = time.monotonic() + 30
    def defunct():
        return [c.pid for c in psutil.Process().children()
                if c.status() == psutil.STATUS_ZOMBIE]
    while time.monotonic() < deadline:
        reaper.tend([node], orphans)
        if not psutil.pid_exists(worker_pid) and not defunct():
            break
        time.sleep(0.1)
    print(json.dumps({
        "worker_alive": psutil.pid_exists(worker_pid),
        "defunct": defunct(),
        "record": host._node_record(node, False),
    }))
    """
)


def test_a_lost_nodes_processes_are_reaped_and_its_orphaned_worker_ended() -> None:
    done = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["worker_alive"] is False  # ended, not left running until the stop
    assert said["defunct"] == []  # the raylet and the worker reaped, not <defunct>
    assert said["record"]["dead"] is True  # ray_state.json marks the lost node


def test_a_live_node_is_not_marked_dead() -> None:
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        node = SimpleNamespace(
            node_id="n", all_processes={"raylet": [SimpleNamespace(process=sleeping)]}
        )
        assert host._node_record(node, False)["dead"] is False
    finally:
        sleeping.kill()
        sleeping.wait()
