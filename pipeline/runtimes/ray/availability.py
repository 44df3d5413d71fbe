"""Which served models have no replica running, as Ray Serve itself reports it.

A replica that cannot load its export (a file changed or gone, a version the trust policy
refuses, memory) fails in its constructor, and Serve keeps retrying it. Requests sent to
a deployment with no running replica wait in Serve's router for one that never comes: a
client saw nothing for its whole timeout, and the ingress's readiness said ready. The
ingress follows Serve's status instead (`serve.status()`, in a thread, every PERIOD_S):
a model whose deployment has no RUNNING replica and that Serve calls UNHEALTHY or
DEPLOY_FAILED is down, with Serve's reason (the constructor's exception). Readiness then
says not ready, and a request waits at most WAIT_S for a replica to come back (a replica
replaced after a crash starts within that) before it gets 503 with the reason; so does one
that was already waiting in Serve's router when its replica died (`answer`).

A deployment scaled to zero by autoscaling is HEALTHY with no replica: it is not down, and
its requests wait for the scale-up as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

PERIOD_S = 1.0
WAIT_S = 5.0
FAILED = ("UNHEALTHY", "DEPLOY_FAILED")


def reason(message: str) -> str:
    """Serve's deployment message in one line: the exception's own line when it carries a
    traceback ("A replica failed to start with exception. … Error:\\n Traceback … \\n
    pipeline.core.signing.SignatureError: Refused: …"), else the message."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return lines[-1][:600] if lines else "Ray Serve gives no reason"


def unavailable(status: Any, app: str, deployments: dict[str, str]) -> dict[str, str]:
    """model → why, for each model (→ its deployment's name) of application `app` in
    `status` (a ServeStatus) that has no running replica and a failed status."""
    found = getattr(status, "applications", {}).get(app)
    if found is None:
        return {}
    down = {}
    for model, deployment in deployments.items():
        overview = found.deployments.get(deployment)
        if overview is None:
            continue
        running = sum(
            n for state, n in overview.replica_states.items() if _name(state) == "RUNNING"
        )
        if running == 0 and _name(overview.status) in FAILED:
            down[model] = reason(overview.message)
    return down


def _name(member: Any) -> str:
    """A Serve enum's value ("RUNNING"): str() of a str-mixin Enum is its qualified name."""
    return str(getattr(member, "value", member))


class Down(Exception):  # noqa: N818 - a state, not an error of this code
    """A model with no replica running, for longer than a request waits: its reason."""


def _cancel(call: Any) -> None:
    try:
        call.cancel()
    except Exception as err:  # noqa: BLE001 - already answered, cancelled or unassigned
        log.debug("cancel: %s", err)


class Availability:
    """The models of this replica's application that are down, kept current in a thread."""

    def __init__(self, deployments: dict[str, str]) -> None:
        from ray import serve

        self.deployments = deployments
        self.down: dict[str, str] = {}
        self._app = serve.get_replica_context().app_name
        threading.Thread(target=self._follow, name="availability", daemon=True).start()

    def _follow(self) -> None:
        from ray import serve

        while True:
            try:
                self.down = unavailable(serve.status(), self._app, self.deployments)
            except Exception as err:  # noqa: BLE001 - a controller being replaced: ask again
                log.debug("Serve's status not read: %s", err)
            time.sleep(PERIOD_S)

    async def answer(self, call: Any, model: str) -> Any:
        """`call`'s result (a DeploymentResponse). A request sent just before its replica
        died passed `wait` and is held by Serve's router, which never gives up on it: once
        `model` is down and stays down for WAIT_S, it is cancelled and Down raised."""
        pending = asyncio.ensure_future(call)
        while True:
            done, _ = await asyncio.wait({pending}, timeout=PERIOD_S)
            if done:
                return pending.result()
            if model in self.down:
                why = await self.wait(model)
                if why is not None and not pending.done():
                    pending.cancel()
                    # Best effort, and it may block on Serve's router loop: not on this one.
                    await asyncio.to_thread(_cancel, call)
                    raise Down(why)

    async def wait(self, model: str) -> str | None:
        """None once `model` is not down (at once, almost always); else, after WAIT_S,
        why it is."""
        deadline = time.monotonic() + WAIT_S
        while model in self.down:
            if time.monotonic() >= deadline:
                return self.down.get(model)
            await asyncio.sleep(0.2)
        return None
