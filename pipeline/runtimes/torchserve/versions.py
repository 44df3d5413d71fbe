"""The gateway's side of versions on TorchServe: which TorchServe version a request goes
to, what it answers with, and when a version taken out of service has drained.

`pipeline rollout` registers a version with TorchServe (liveops.py), then writes the
run folder's live state (pipeline.serving.live). The gateway watches that file: an
unversioned `/predictions/<archive>` goes to the default version or, for its share, to
the canary, always named explicitly upstream (`/predictions/<archive>/<version>`),
so the gateway knows which version answered and says so in `X-Model-Version`. It
acknowledges a state only once the requests still running on a version it no longer
routes to have finished, so the rollout unregisters that version from TorchServe
with nothing in flight on it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pipeline.serving import live


class Router:
    def __init__(self, run_dir: Path | None) -> None:
        self.run_dir = Path(run_dir) if run_dir else None
        self.state: live.LiveState | None = None
        self.splitters: dict[str, live.Splitter] = {}
        self.inflight: dict[tuple[str, str], int] = {}
        self.tallies: dict[tuple[str, int], live.Tally] = {}

    def route(self, archive: str, version: str | None) -> str | None:
        """The TorchServe version to send to: the one asked for, else the split's; None
        when no live state names the archive (TorchServe's own default answers)."""
        if version:
            return version
        mv = self.state.models.get(archive) if self.state else None
        # An archive of no store version (its TorchServe version is the archiver's "1.0",
        # not a number): TorchServe's own default answers, as without live versions.
        if mv is None or not mv.versions[mv.default].export_dir:
            return None
        split = self.splitters.setdefault(archive, live.Splitter())
        if mv.canary is not None and split.to_canary(mv.percent):
            return str(mv.canary)
        return str(mv.default)

    def started(self, archive: str, version: str) -> None:
        key = (archive, version)
        self.inflight[key] = self.inflight.get(key, 0) + 1

    def finished(self, archive: str, version: str, began: float, ok: bool, counted: bool) -> None:
        key = (archive, version)
        self.inflight[key] -= 1
        if counted and version.isdigit():  # the split's traffic: what a canary is judged on
            tally = self.tallies.setdefault((archive, int(version)), live.Tally())
            tally.add((time.perf_counter() - began) * 1000.0, ok)

    async def run(self) -> None:
        if self.run_dir is not None:
            await live.follow(self.run_dir, 0, self.tallies, self._apply)

    async def _apply(self, state: live.LiveState) -> None:
        old = self.state.models.items() if self.state else ()
        before = {(name, v) for name, mv in old for v in mv.versions}
        for name, mv in state.models.items():
            for number in mv.versions:
                if (name, number) not in before:
                    self.tallies.pop((name, number), None)  # in service again: starts afresh
        self.state = state  # one assignment: each request sees the old or the new split
        kept = {(n, str(v)) for n, mv in state.models.items() for v in mv.versions}
        while any(n and key not in kept for key, n in self.inflight.items()):
            await asyncio.sleep(0.01)  # requests on a version no longer routed to: let them end
        # Acknowledged (live.follow) only now: the rollout unregisters what is drained.
