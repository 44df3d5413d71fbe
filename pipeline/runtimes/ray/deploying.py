"""Waiting for this run's Serve application to run, and saying why it does not.

`serve.run` waits in Ray's own loop: on a joined cluster with no CPU free for a replica
it waited without a word until `pipeline serve` gave up (the reason, "taken more than
30s to be scheduled ... Resources required", was only in Serve's status), and a replica
that failed to load surfaced as "Deploying application ... failed: Failed to update the
deployments", its error nowhere. Worse, a SIGTERM or a failure during that wait left the
application on the cluster, where `pipeline stop` could no longer reach it. The host
deploys without Serve's wait (`serve._run(_blocking=False)`) and waits here instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

log = logging.getLogger("pipeline.runtimes.ray")

UNPLACED_HINT = (
    "no node has the CPU a replica reserves: --ray-replica-cpus 0 places replicas without "
    "reserving one, or add nodes (`ray start --address ... --num-cpus N`)"
)


def short(message: str) -> str:
    """Serve's deployment message on one line: a traceback's first and last lines."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if len(lines) <= 2:
        return " ".join(lines)
    return f"{lines[0]} ... {lines[-1]}"


def explained(message: str) -> str:
    """A deployment's message, with what to do when it says a replica cannot be placed."""
    text = short(message)
    if "Resources required" in message or "to be scheduled" in message:
        return f"{text} ({UNPLACED_HINT})"
    return text


def wait_running(app: str, stop: Sequence[object], poll_s: float = 0.5) -> str | None:
    """Wait until Serve says `app` is RUNNING: None then, else why not (its deployments'
    messages when it failed to deploy, or that a stop was asked for, `stop` non-empty).
    While it deploys, each deployment's message is logged once as it changes."""
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    said: dict[str, str] = {}
    while not stop:
        status = serve.status().applications.get(app)
        if status is not None:
            if status.status == ApplicationStatus.RUNNING:
                return None
            messages = {n: d.message for n, d in status.deployments.items() if d.message}
            if status.status == ApplicationStatus.DEPLOY_FAILED:
                why = "; ".join(f"{n}: {explained(m)}" for n, m in messages.items())
                return why or short(status.message) or "Serve says DEPLOY_FAILED"
            for name, message in messages.items():
                if said.get(name) != message:
                    log.warning("%s is not running yet: %s", name, explained(message))
                    said[name] = message
        time.sleep(poll_s)
    return "stopped (SIGTERM or Ctrl-C) while it deployed"
