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


def replicas_now(server: Server, name: str) -> list[dict[str, Any]]:
    """`name`'s live replicas: {"pid", "node_id"} each."""
    return list(read(server).get("replicas", {}).get(name, []))
