"""The Ray runtime's replicas as its host process last saw them (ray_state.json, refreshed
twice a second): read by loadtest without joining the cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.runtimes.ray.constants import STATE_FILE
from pipeline.serving.server import Server


def read(server: Server) -> dict[str, Any]:
    """The state file; empty lists while the host has not written it."""
    try:
        return json.loads((Path(server.run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {"nodes": [], "replicas": {}}


def node_alive(node: dict[str, Any]) -> bool:
    """Whether a recorded node still runs: not marked lost by the host, and its raylet's
    process alive (a node killed since the host's last refresh is not yet marked)."""
    import psutil

    if node.get("dead"):
        return False
    pid = node.get("raylet_pid")
    if pid is None:
        return True  # a record without it (a joined cluster's): not known to be dead
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def replicas_now(server: Server, name: str) -> list[dict[str, Any]]:
    """`name`'s live replicas: {"pid", "node_id"} each."""
    return list(read(server).get("replicas", {}).get(name, []))
