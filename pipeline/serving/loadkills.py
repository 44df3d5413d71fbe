"""What `pipeline loadtest` kills part-way through a run (a worker, a node) and when it
refuses to: split from loadtest.py, which it serves.

A refusal comes before any load is sent, and before a private server is started for a
run it would refuse anyway (a head-only Ray cluster took 46 s to start before the
refusal that it had no worker node to lose).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.serving import runtime
    from pipeline.serving.server import Server


@dataclass
class NodeKill:
    """When the node was killed, the last failure after it, and the answers since."""

    at: float | None = None  # time.monotonic() of the kill
    at_perf: float = 0.0  # the same moment on the requests' clock
    last_failure: float | None = None
    answered_at: list[float] = field(default_factory=list)

    def recovery_s(self) -> float | None:
        """Kill → the first answer after the last failure (the kill itself when none failed)."""
        if self.at is None:
            return None
        since = self.last_failure or self.at
        after = [t for t in self.answered_at if t >= since]
        return min(after) - self.at if after else None


def kill_refusal(
    encodings: tuple[str, ...],
    kill_worker_after: int | None,
    kill_node_after: int | None,
    rt: runtime.Runtime,
) -> str | None:
    """Why `rt` cannot take this run: a kill it does not offer (or an encoding it does not
    read), with what it does instead; None when it can."""
    readable = rt.protocol.encodings
    unread = [e for e in encodings if readable is not None and e not in readable]
    if unread:
        return (
            f"{rt.title} reads the encodings {', '.join(readable or ())}, not {', '.join(unread)}."
        )
    if kill_worker_after is not None and not rt.replaces_workers:
        # A cluster runtime replaces a killed replica itself: say so (its own wording).
        why = (
            rt.nodes.worker_kill_refused
            if rt.nodes is not None
            else "it does not declare that it replaces a killed worker itself"
        )
        return f"--kill-worker-after is not offered on {rt.title}: {why}."
    if kill_node_after is not None and rt.nodes is None:
        return (
            f"--kill-node-after needs a runtime spread over a cluster's nodes; {rt.title} runs "
            "on one machine (serve with --runtime ray --ray-nodes 2 --ray-replicas 2)."
        )
    return None


def private_kill_refusal(kill_node_after: int | None, rt: runtime.Runtime) -> str | None:
    """Why `loadtest --serve` cannot lose a node of `rt`'s private server (which has none
    to spare), before that server is started; None when it can or no node kill is asked."""
    if kill_node_after is None or rt.nodes is None or rt.nodes.private_kill_refused is None:
        return None
    return f"--kill-node-after with --serve: {rt.nodes.private_kill_refused}."


def node_kill_refusal(rt: runtime.Runtime, server: Server, name: str) -> str | None:
    """Why no node of `server` may be killed now (fewer than two worker nodes serve `name`:
    the kill would take the last one, and every request after it would fail); None when
    one may."""
    if rt.nodes is None:
        return None
    try:
        rt.nodes.refuse_kill(server, name)
    except ValueError as err:
        return f"--kill-node-after: {err}."
    return None
