"""Which of TorchServe's worker processes are alive, for the gateway's resends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psutil

log = logging.getLogger("pipeline.runtimes.torchserve.gateway")


class WorkerWatch:
    """Notices when one of TorchServe's worker processes dies.

    TorchServe 0.12 does not always answer the requests a worker was running
    when it died: under load here, a SIGKILLed worker's batch got no answer at
    all in about three runs of four (the client waits until its own timeout),
    and `507` in others. Inference is a pure function, so the gateway sends
    such requests again itself: every request in flight when a worker dies is
    cancelled (the handler task waiting on TorchServe) and resent (at most
    `MAX_RESENDS` times), and queues until the replacement worker is up. A
    death in another model's worker costs a duplicate computation, never a
    wrong or lost answer.
    """

    INTERVAL_S = 0.25

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.inflight: set[asyncio.Task[Any]] = set()  # handler tasks waiting on TorchServe
        self.resend: set[asyncio.Task[Any]] = set()  # cancelled by a death: send again
        self._workers: set[int] = set()

    def _scan(self) -> set[int]:
        try:
            children = psutil.Process(self.server_pid).children(recursive=True)
        except psutil.Error:
            return set()
        found = set()
        for proc in children:
            if proc.pid in self._workers:
                found.add(proc.pid)
                continue
            with contextlib.suppress(psutil.Error):
                if any("model_service_worker" in part for part in proc.cmdline()):
                    found.add(proc.pid)
        return found

    async def run(self) -> None:
        self._workers = await asyncio.to_thread(self._scan)
        while True:
            await asyncio.sleep(self.INTERVAL_S)
            now = await asyncio.to_thread(self._scan)
            gone = self._workers - now
            self._workers = now
            if gone:
                self.resend_in_flight(gone)

    def resend_in_flight(self, gone: set[int]) -> None:
        """Cancel every request waiting on TorchServe; forward() sends each again."""
        log.warning("worker process(es) %s died; resending the requests in flight", sorted(gone))
        self.resend |= self.inflight
        for task in self.inflight:
            task.cancel()


# Resends after a worker death (see WorkerWatch); then the client gets 503 and may retry.
MAX_RESENDS = 3
