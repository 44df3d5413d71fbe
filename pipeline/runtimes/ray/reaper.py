"""The host's care of the processes of a local cluster's lost nodes (host.py's refresh).

The host is the child subreaper of the cluster it starts, so a Ray process whose parent
dies (a killed raylet's workers, agents and replicas) becomes the host's child. Without a
`waitpid` outside `pipeline stop`, every one of them that exited stayed a zombie
(<defunct>) for as long as the run; and a replica whose raylet was SIGKILLed alone kept
running, orphaned, with its model in memory (about 210 MB each), until the stop.

So on each refresh the host reaps what has exited, notes every live node's raylet's
descendants, and once a node's raylet is gone SIGKILLs those of them it has adopted
(their parent is now the host: they are this run's, not a reused pid of someone else's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

log = logging.getLogger("pipeline.runtimes.ray")


def reap() -> list[int]:
    """Wait for every child that has exited, without blocking; their pids."""
    reaped = []
    with contextlib.suppress(ChildProcessError):  # no child left at all
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            reaped.append(pid)
    return reaped


def raylet_alive(node: Any) -> bool:
    """Whether a `ray._private.node.Node`'s raylet runs (a node without one recorded: yes).
    Popen.poll reads a child reaped by `reap` as exited."""
    infos = node.all_processes.get("raylet") or []
    return not infos or infos[0].process.poll() is None


class Orphans:
    """Each live node's raylet's descendants as last seen, by node id; ended once their
    node's raylet is gone."""

    def __init__(self) -> None:
        self.seen: dict[str, set[int]] = {}

    def see(self, node_id: str, raylet_pid: int) -> None:
        import psutil

        try:
            kids = psutil.Process(raylet_pid).children(recursive=True)
        except psutil.Error:
            return
        # Added to, not replaced (a raylet being killed has handed its children on before
        # it is gone), less those that have exited: a pid ever seen may be reused.
        before = {p for p in self.seen.get(node_id, set()) if psutil.pid_exists(p)}
        self.seen[node_id] = before | {k.pid for k in kids}

    def end(self, node_id: str) -> list[int]:
        """SIGKILL the lost node's processes this one adopted; their pids. A recorded pid
        whose parent is not this process is left alone: it exited, was reaped and may
        be someone else's now."""
        import psutil

        ended = []
        for pid in sorted(self.seen.pop(node_id, set())):
            try:
                proc = psutil.Process(pid)
                if proc.ppid() != os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                continue
            ended.append(pid)
        if ended:
            log.info("node %s lost: ended its orphaned processes %s", node_id, ended)
        return ended


def tend(nodes: list[Any], orphans: Orphans) -> None:
    """One refresh: reap the exited, note the live nodes' processes, end a lost node's."""
    reap()
    for node in nodes:
        infos = node.all_processes.get("raylet") or []
        if raylet_alive(node):
            if infos:
                orphans.see(node.node_id, infos[0].process.pid)
        elif node.node_id in orphans.seen:
            orphans.end(node.node_id)
    reap()
