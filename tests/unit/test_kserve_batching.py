"""The KServe runtime's batcher: queued requests stacked, split back, never mixed when told."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from pipeline.runtimes.kserve.batching import Batcher


def _batcher(stack: bool = True, **kwargs) -> tuple[Batcher, list[int]]:
    sizes: list[int] = []
    gate = threading.Event()

    def forward(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        gate.wait(5)  # the first call holds the worker until every request is queued
        x = batch["x"]
        return [x * 2, x.sum(axis=1, keepdims=True)]

    b = Batcher(
        forward=forward,
        input_axes={"x": 0},
        output_axes=[0, 0],
        stack=stack,
        on_batch=sizes.append,
        **kwargs,
    )
    b.gate = gate  # type: ignore[attr-defined]
    return b, sizes


async def _run(b: Batcher, xs: list[np.ndarray]) -> list[list[np.ndarray]]:
    tasks = [asyncio.ensure_future(b.submit({"x": x})) for x in xs]
    await asyncio.sleep(0.05)  # all queued; the first is in its forward pass
    b.gate.set()  # type: ignore[attr-defined]
    out = await asyncio.gather(*tasks)
    await b.close()
    return out


def test_queued_requests_are_stacked_and_split_back() -> None:
    b, sizes = _batcher(max_batch_size=4)
    xs = [np.full((1 + i % 2, 3), float(i), np.float32) for i in range(7)]
    outs = asyncio.run(_run(b, xs))
    for x, (double, total) in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(double, x * 2)
        np.testing.assert_array_equal(total, x.sum(axis=1, keepdims=True))
    assert sum(sizes) == 7 and max(sizes) == 4 and len(sizes) <= 3


def test_different_shapes_are_not_stacked() -> None:
    b, sizes = _batcher()
    xs = [np.ones((1, 3), np.float32), np.ones((1, 3), np.float32), np.ones((1, 5), np.float32)]
    outs = asyncio.run(_run(b, xs))
    assert [o[0].shape for o in outs] == [(1, 3), (1, 3), (1, 5)]
    assert sum(sizes) == 3 and max(sizes) <= 2


def test_stack_requests_false_runs_each_alone() -> None:
    b, sizes = _batcher(stack=False)
    xs = [np.full((1, 3), float(i), np.float32) for i in range(5)]
    outs = asyncio.run(_run(b, xs))
    assert sizes == [1] * 5
    for x, (double, _) in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(double, x * 2)


def test_an_input_without_batch_axis_disables_stacking() -> None:
    b = Batcher(forward=lambda batch: [], input_axes={"x": 0, "scale": None}, output_axes=[0])
    assert b.stack is False


def test_a_failure_reaches_every_request_of_its_batch() -> None:
    def forward(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise RuntimeError("boom")

    b = Batcher(forward=forward, input_axes={"x": 0}, output_axes=[0])

    async def go() -> None:
        with pytest.raises(RuntimeError, match="boom"):
            await b.submit({"x": np.ones((1, 2), np.float32)})
        await b.close()

    asyncio.run(go())


def test_a_request_the_model_cannot_take_fails_alone_not_its_batch() -> None:
    """A user's trial: token ids past the vocabulary failed ONNX Runtime's Gather, and
    every request stacked with one (206 of 360 good ones) got its 500."""
    gate = threading.Event()
    sizes: list[int] = []

    def forward(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        gate.wait(5)
        if (batch["x"] < 0).any():
            raise RuntimeError("indices element out of data bounds")
        return [batch["x"] * 2]

    b = Batcher(forward=forward, input_axes={"x": 0}, output_axes=[0], on_batch=sizes.append)

    async def go() -> list:
        xs = [np.full((1, 2), v, np.float32) for v in (1.0, 2.0, -1.0, 3.0)]
        tasks = [asyncio.ensure_future(b.submit({"x": x})) for x in xs]
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(*tasks, return_exceptions=True)
        await b.close()
        return out

    first, second, bad, third = asyncio.run(go())
    assert isinstance(bad, RuntimeError) and "out of data bounds" in str(bad)
    for answer, value in ((first, 1.0), (second, 2.0), (third, 3.0)):
        np.testing.assert_array_equal(answer[0], np.full((1, 2), value * 2, np.float32))
    assert sizes == [4, 1, 1, 1, 1], sizes  # stacked, failed, then each alone


def test_delay_waits_for_more_requests() -> None:
    sizes: list[int] = []
    b = Batcher(
        forward=lambda batch: [batch["x"]],
        input_axes={"x": 0},
        output_axes=[0],
        max_batch_size=8,
        max_delay_ms=200,
        on_batch=sizes.append,
    )

    async def go() -> None:
        first = asyncio.ensure_future(b.submit({"x": np.zeros((1, 2), np.float32)}))
        await asyncio.sleep(0.02)
        rest = [b.submit({"x": np.ones((1, 2), np.float32)}) for _ in range(3)]
        await asyncio.gather(first, *rest)
        await b.close()

    asyncio.run(go())
    assert sizes == [4]


@pytest.mark.parametrize("kwargs", [{"max_batch_size": 0}, {"max_delay_ms": -1}])
def test_bad_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be"):
        Batcher(forward=lambda b: [], input_axes={"x": 0}, output_axes=[0], **kwargs)


def test_cheap_passes_run_on_the_loop_and_a_slow_one_goes_back_to_a_thread() -> None:
    # A thread's round trip costs more than a sub-millisecond pass: once the batcher has
    # seen passes that cheap it runs them on the event loop; a slow one (a large request)
    # sends the next back to a thread, so the loop keeps reading requests.
    threads: list[int] = []
    slow = {10}  # the 11th pass sleeps past inline_below_ms

    def forward(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        threads.append(threading.get_ident())
        if len(threads) - 1 in slow:
            threading.Event().wait(0.005)
        return [batch["x"]]

    async def go() -> int:
        b = Batcher(forward=forward, input_axes={"x": 0}, output_axes=[0])
        for i in range(12):
            out = await b.submit({"x": np.full((1, 2), float(i), np.float32)})
            np.testing.assert_array_equal(out[0], np.full((1, 2), float(i)))
        await b.close()
        return threading.get_ident()

    loop_thread = asyncio.run(go())
    on_loop = [t == loop_thread for t in threads]
    assert on_loop[0] is False  # its cost unknown: a thread
    assert all(on_loop[1:11])  # cheap, seen: on the loop (the 11th is the slow one)
    assert on_loop[11] is False  # after the slow one: a thread again


def test_each_request_is_told_its_queue_wait_and_its_forward_pass() -> None:
    """One request per pass: the first holds the model ~0.05 s (the gate), so the ones
    queued behind it waited about that long, and each is told the pass it was part of."""
    timings: list[tuple[float, float]] = []
    b, sizes = _batcher(max_batch_size=1, on_timing=lambda q, c: timings.append((q, c)))
    asyncio.run(_run(b, [np.ones((1, 3), np.float32)] * 4))
    assert len(timings) == 4 and sizes == [1, 1, 1, 1]
    first, *queued = timings
    assert first[0] < 0.02 and first[1] >= 0.04  # it ran at once, held by the gate
    assert all(q >= 0.04 and c < first[1] for q, c in queued), timings  # they waited for it
