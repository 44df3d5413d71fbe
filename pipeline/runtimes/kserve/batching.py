"""Dynamic batching inside the KServe runtime: stack the requests already queued.

KServe's own batcher is the Kubernetes agent sidecar; the Python ModelServer
has none, so each served model owns a `Batcher`. Requests (REST and gRPC
share one event loop, so one queue) wait in an asyncio queue; a worker task
takes the first, then everything already queued up to `max_batch_size`
requests (and, with `max_delay_ms` > 0, waits that long for more). Requests
whose non-batch shapes agree are concatenated along their batch axis and run
as one forward pass, in a thread, or on the event loop itself when recent passes
took under `inline_below_ms` (a thread's round trip would cost more than the
pass); the outputs are split back per request. A stacked pass that fails is run again
request by request, so a request the model cannot take fails alone, not its peers.

Models whose manifest says `serving.stack_requests: false` (a sample's output
depends on the rest of its batch) are never stacked: every request gets its
own forward pass, whatever else is queued.

No torch and no kserve here, so it is unit-tested on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# One forward pass: named input arrays → output arrays in the manifest's order.
Forward = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


@dataclass
class _Pending:
    arrays: dict[str, np.ndarray]
    future: asyncio.Future[list[np.ndarray]]
    queued: float = field(default_factory=time.perf_counter)  # when it was submitted
    # Its forward pass: when it began, how long it took, how many requests it carried.
    began: float = 0.0
    took: float = 0.0
    size: int = 0


@dataclass
class Batcher:
    """Stacks queued requests for `forward`; `submit` is what a request awaits."""

    forward: Forward
    input_axes: dict[str, int | None]  # input name → its batch axis (None: no batch axis)
    output_axes: Sequence[int]  # each output's batch axis
    max_batch_size: int = 8  # requests per forward pass
    max_delay_ms: float = 0.0  # 0: only what is already queued
    stack: bool = True  # False: one request per forward pass, never mixed
    on_batch: Callable[[int], None] | None = None  # told the size of every forward pass
    # Told, per request, the seconds it waited in the queue and the seconds of the forward
    # pass it was part of (the server's own split of a request's time).
    on_timing: Callable[[float, float], None] | None = None
    # Forward passes whose recent cost (an average, `_cost_s`) is under this run on the
    # event loop itself: handing one to a thread and back costs more than it leaves the
    # loop free for (0.3-0.4 ms of a 1 ms request at concurrency 1 for the digits CNN).
    inline_below_ms: float = 1.0
    _cost_s: float | None = field(default=None, init=False, repr=False)
    _queue: asyncio.Queue[_Pending] | None = field(default=None, init=False, repr=False)
    _worker: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.max_delay_ms < 0:
            raise ValueError(f"max_batch_delay_ms must be >= 0, got {self.max_delay_ms}")
        # An input without a batch axis (a shared scale, say) cannot be stacked either.
        self.stack = self.stack and all(ax is not None for ax in self.input_axes.values())

    async def submit(
        self, arrays: dict[str, np.ndarray], stamps: list[_Pending] | None = None
    ) -> list[np.ndarray]:
        """Run one request's arrays (each with its batch axis); → its outputs. `stamps`:
        a list to append the request's record to (its queue and forward-pass times)."""
        loop = asyncio.get_running_loop()
        if self._queue is None:  # created lazily: there is no loop before the server runs
            self._queue = asyncio.Queue()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run())
        pending = _Pending(arrays, loop.create_future())
        if stamps is not None:
            stamps.append(pending)
        await self._queue.put(pending)
        return await pending.future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _take(self) -> list[_Pending]:
        assert self._queue is not None
        taken = [await self._queue.get()]
        while len(taken) < self.max_batch_size and not self._queue.empty():
            taken.append(self._queue.get_nowait())
        if self.max_delay_ms > 0 and len(taken) < self.max_batch_size:
            deadline = asyncio.get_running_loop().time() + self.max_delay_ms / 1000
            while len(taken) < self.max_batch_size:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    taken.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
        return [p for p in taken if not p.future.done()]  # a client that gave up

    async def _run(self) -> None:
        while True:
            taken = await self._take()
            for members in self.groups([p.arrays for p in taken]):
                await self._forward([taken[i] for i in members])

    def _timed(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        start = time.perf_counter()
        outputs = self.forward(batch)
        took = time.perf_counter() - start
        # A moving average: one slow pass (a large request) moves it back to the thread.
        self._cost_s = took if self._cost_s is None else 0.8 * self._cost_s + 0.2 * took
        if took * 1e3 >= self.inline_below_ms:
            self._cost_s = max(self._cost_s, took)
        return outputs

    def groups(self, requests: Sequence[dict[str, np.ndarray]]) -> list[list[int]]:
        """Indices of the requests that can share one forward pass, in arrival order."""
        out: dict[Any, list[int]] = {}
        for i, arrays in enumerate(requests):
            key: Any = (i,)
            if self.stack:
                key = tuple(
                    (name, tuple(d for ax, d in enumerate(arrays[name].shape) if ax != axis))
                    for name, axis in self.input_axes.items()
                )
            out.setdefault(key, []).append(i)
        return list(out.values())

    async def _forward(self, members: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        if len(members) == 1:
            batch = members[0].arrays
        else:
            batch = {
                name: np.concatenate([m.arrays[name] for m in members], axis=axis or 0)
                for name, axis in self.input_axes.items()
            }
        if self.on_batch is not None:
            self.on_batch(len(members))
        began = time.perf_counter()
        try:
            if self._cost_s is not None and self._cost_s * 1e3 < self.inline_below_ms:
                outputs = self._timed(batch)
            else:  # unknown or slow: in a thread, so the loop goes on reading requests
                outputs = await loop.run_in_executor(None, self._timed, batch)
        except Exception as err:
            if len(members) > 1:  # one bad request must not fail its peers: each alone
                log.warning(
                    "a pass of %d stacked requests failed (%s); each alone", len(members), err
                )
                for m in members:
                    await self._forward([m])
                return
            log.exception("inference failed for 1 request")
            if not members[0].future.done():
                members[0].future.set_exception(err)
            return
        took = time.perf_counter() - began
        for m in members:
            m.began, m.took, m.size = began, took, len(members)
            if self.on_timing is not None:
                self.on_timing(began - m.queued, took)
        if len(members) == 1:
            if not members[0].future.done():
                members[0].future.set_result(outputs)
            return
        start = 0
        first, axis = next(iter(self.input_axes.items()))
        for m in members:
            n = m.arrays[first].shape[axis or 0]
            parts = [
                np.take(o, range(start, start + n), axis=ax)
                for o, ax in zip(outputs, self.output_axes, strict=False)
            ]
            start += n
            if not m.future.done():
                m.future.set_result(parts)
