"""Names the Ray runtime's modules share (light: no Ray import)."""

from __future__ import annotations

NAME = "ray"
TITLE = "the Ray Serve runtime"
CONFIG_FILE = "ray.json"  # on the host process's command line: how `stop` knows it
STATE_FILE = "ray_state.json"  # what the host started: nodes, their pids, the replicas
READY_FILE = "ray.ready"
APP_PREFIX = "pipeline"
# A custom resource only the head of a cluster the runtime starts has: the ingress asks
# for a sliver of it, so it always runs beside the proxy and never on a worker node.
HEAD_RESOURCE = "pipeline_head"
# In the environment of the host and so of every Ray process it starts. Usage statistics
# off (nothing leaves the machine); RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray answer
# the loopback address as the node's own, without which a driver cannot join a cluster
# whose nodes listen on 127.0.0.1 only (ray._private.services.resolve_ip_for_localhost).
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_DEDUP_LOGS": "0",
}
# Set by the host for a cluster it starts on 127.0.0.1: each replica then binds Ray Serve's
# inter-deployment gRPC server to 127.0.0.1 rather than [::] (app.py, _loopback_only).
LOOPBACK_ENV = "PIPELINE_RAY_LOOPBACK"


def deployment_name(model: str) -> str:
    """A served model's deployment in the application (its replicas' actor class is
    `ServeReplica:<app>:<this>`)."""
    return f"model-{model}"
