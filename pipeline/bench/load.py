"""Measuring one served model, whatever serves it: the bench's served points.

Both runtimes are measured with the same clients and the same code, so their
figures compare: concurrency 1 over one kept-alive stdlib connection per
path, alternating the paths request by request (`sequential`), and higher
concurrency from one asyncio loop (`measure`). The request body is a
`wire.Body` in the server's protocol (TorchServe's `.npy`, or the Open
Inference Protocol's binary extension), and the first answer is checked
against eager before anything is timed (`check_answer`), so a broken server
cannot look fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import http.client
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch

from pipeline.bench import split
from pipeline.core.compare import compare_outputs
from pipeline.core.errors import PipelineError
from pipeline.serving import client, runtime, wire
from pipeline.serving.runtime import BenchSettings
from pipeline.serving.server import Server

log = logging.getLogger(__name__)

# Warm-up per format and level: one request per client opens its connection and
# fills the worker's batch path; two per client (64 resnet18 requests at 32
# clients) took 3 s a level and a minute of `make bench` for no change in p50.
WARMUP_BUDGET_S = 1.5


@dataclass
class ServedPoint:
    model: str
    # <runtime>/<format>: torchserve/onnx, kserve/onnx; torchserve/onnx/direct (no gateway)
    backend: str
    batching: str  # served.BATCHING's key, or "on" for the KServe runtime's defaults
    concurrency: int
    requests: int
    failed: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    throughput: float  # answered requests per second (one sample each)
    # On the concurrency-1 point: the first request after the model was READY
    # (handlers warm up in initialize, so it should cost about a steady one).
    first_request_ms: float | None = None
    mean_ms: float = 0.0
    # The server's own split of the row's mean (pipeline.bench.split): ms per request in
    # decode, queue, compute, encode, their sum, and the client-and-HTTP remainder.
    server_ms: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(
        cls, latencies_ms: list[float], failed: int, elapsed_s: float, **point: Any
    ) -> ServedPoint:
        """A point from one level's latencies: percentiles and answered requests per second."""
        arr = np.asarray(latencies_ms)
        return cls(
            requests=len(arr),
            failed=failed,
            median_ms=float(np.percentile(arr, 50)),
            mean_ms=float(arr.mean()),
            p90_ms=float(np.percentile(arr, 90)),
            p99_ms=float(np.percentile(arr, 99)),
            throughput=(len(arr) - failed) / elapsed_s,
            **point,
        )


def sequential_point(latencies_ms: list[float], failed: int, **point: Any) -> ServedPoint:
    """A concurrency-1 point from `sequential`: its throughput is over the requests' own
    time (the alternated paths' requests do not overlap)."""
    elapsed_s = float(np.sum(latencies_ms)) / 1e3
    return ServedPoint.of(latencies_ms, failed, elapsed_s, concurrency=1, **point)


async def _load(
    server: Server,
    name: str,
    body: wire.Body,
    concurrency: int,
    requests: int,
    timeout: float,
    budget_s: float | None = None,
) -> tuple[list[float], int, float]:
    """`requests` requests from `concurrency` clients; no new ones after `budget_s`."""
    latencies: list[float] = []
    failed = 0
    left = requests
    async with client.AsyncClient(server, concurrency=concurrency, timeout=timeout) as http:
        send = http.sender(name, body.content, body.content_type, body.headers)
        clock = time.perf_counter

        async def lane() -> None:
            nonlocal left, failed
            while left > 0 and (deadline is None or clock() < deadline):
                left -= 1
                t0 = clock()
                ok = await send()
                latencies.append((clock() - t0) * 1e3)
                failed += not ok

        start_t = time.perf_counter()
        deadline = start_t + budget_s if budget_s else None
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start_t
    return latencies, failed, elapsed


def check_answer(
    server: Server, name: str, body: wire.Body, expected: dict[str, torch.Tensor]
) -> float:
    """The first request after READY: checked against eager; returns its latency (ms).

    The client is built before the clock starts (building one costs more than
    a request), so the figure is the server's first-request cost.
    """
    with client.Client(server, timeout=120, retries=0) as http:
        t0 = time.perf_counter()
        answer = http.send(name, body.content, body.content_type, body.headers)
        elapsed_ms = (time.perf_counter() - t0) * 1e3
    if not answer.ok:
        raise PipelineError(f"{name}: {answer.problem}")
    got = runtime.of(server).protocol.answer(answer.response)
    mismatch = compare_outputs(
        list(expected.values()),
        [got[n].reshape(e.shape).to(e.dtype) for n, e in expected.items()],
        atol=1e-3,
        rtol=1e-3,
    )
    if mismatch:
        raise PipelineError(
            f"{name} answered outside tolerance ({mismatch}); not benchmarking a wrong server."
        )
    return elapsed_ms


def _one_connection(server: Server, timeout: float) -> http.client.HTTPConnection:
    url = urlsplit(server.inference_url)
    if url.scheme == "https":
        ctx = client.tls_context(server)
        return http.client.HTTPSConnection(
            url.hostname or "127.0.0.1",
            url.port,
            timeout=timeout,
            context=ctx if isinstance(ctx, ssl.SSLContext) else None,
        )
    return http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)


# Called with the served names whose measured requests begin (their warm-up done):
# every_level reads the server's stage totals then, so a row's server split is over its
# measured requests only (warm-up requests, slower, once made the server's mean exceed
# the client's).
_WARMED: contextvars.ContextVar[Callable[[list[str]], None] | None] = contextvars.ContextVar(
    "warmed", default=None
)


def _warmed(names: list[str]) -> None:
    hook = _WARMED.get()
    if hook is not None:
        hook(names)


@contextlib.contextmanager
def windows(probe: split.Probe | None) -> Iterator[dict[str, split.Totals]]:
    """The server's stage totals (`probe`) read when each served name's measured requests
    begin, after its warm-up (`sequential` and `measure` say when), by served name: the
    start of that name's server-split window for what runs inside."""
    starts: dict[str, split.Totals] = {}

    def warmed(names: list[str]) -> None:
        if probe is not None and any(n not in starts for n in names):
            now = probe()
            starts.update({n: now for n in names if n not in starts})

    token = _WARMED.set(warmed)
    try:
        yield starts
    finally:
        _WARMED.reset(token)


def sequential(
    paths: dict[str, tuple[Server, str]],
    body: wire.Body,
    requests: int,
    budget_s: float,
) -> dict[str, tuple[list[float], int]]:
    """Concurrency 1 on each of `paths` (key → server and its model's name), request by
    request, alternating: key → (latencies in ms, failed).

    The client is the leanest there is (one kept-alive `http.client`
    connection per path): at concurrency 1 the async client the other levels
    use cost about 1.5 ms a request here, more than a gateway, and would hide
    what is measured. Alternating the paths puts them under the same noise, so
    their differences are the servers'.
    """
    conns = {k: _one_connection(s, timeout=120) for k, (s, _) in paths.items()}
    headers = {}
    for key, (server, _) in paths.items():
        token = server.keys()["inference"]
        headers[key] = {**body.headers, **({"Authorization": f"Bearer {token}"} if token else {})}
    routes = {k: runtime.of(s).protocol.infer_path(name) for k, (s, name) in paths.items()}
    lat: dict[str, list[float]] = {k: [] for k in paths}
    failed = dict.fromkeys(paths, 0)
    # Warm-up: at least 10 rounds and WARMUP_BUDGET_S. The gateway's cost fell from
    # about 0.8 to 0.55 ms over the first few hundred rounds here.
    warm_until = time.perf_counter() + WARMUP_BUDGET_S
    rounds, measured, deadline = 0, False, 0.0
    try:
        while True:
            if not measured and rounds >= 10 and time.perf_counter() > warm_until:
                _warmed([name for _, name in paths.values()])
                measured, rounds, deadline = True, 0, time.perf_counter() + budget_s
            if measured and (rounds >= requests or time.perf_counter() > deadline):
                break
            rounds += 1
            for key, conn in conns.items():
                t0 = time.perf_counter()
                try:
                    conn.request("POST", routes[key], body=body.content, headers=headers[key])
                    resp = conn.getresponse()
                    resp.read()
                    ok = resp.status == 200
                except (OSError, http.client.HTTPException):
                    conn.close()  # reconnects on the next request
                    ok = False
                if measured:
                    lat[key].append((time.perf_counter() - t0) * 1e3)
                    failed[key] += not ok
    finally:
        for conn in conns.values():
            conn.close()
    return {k: (lat[k], failed[k]) for k in paths}


def measure(
    server: Server,
    name: str,
    body: wire.Body,
    level: int,
    requests: int,
    timeout: float,
    budget_s: float,
    **point: Any,
) -> ServedPoint:
    """Warm up at this level (connections open, the batch path hot), then measure."""
    asyncio.run(_load(server, name, body, level, level, timeout, WARMUP_BUDGET_S))
    _warmed([name])
    lat, failed, elapsed = asyncio.run(
        _load(server, name, body, level, requests, timeout, budget_s)
    )
    return ServedPoint.of(lat, failed, elapsed, concurrency=level, **point)


def first_answers(
    server: Server,
    names: dict[str, str],
    body: wire.Body,
    expected: dict[str, torch.Tensor],
    skipped: list[dict[str, Any]],
    *,
    model: str,
    backend: Callable[[str], str],
) -> dict[str, float]:
    """Each served format's first answer, checked (`check_answer`): format → its latency in
    ms. A format that answers wrong or not at all is left out, its reason in `skipped`."""
    first: dict[str, float] = {}
    for fmt, name in names.items():
        try:
            first[fmt] = check_answer(server, name, body, expected)
        except (PipelineError, KeyError, ValueError) as err:
            why = " ".join(str(err).split())[:200]
            log.warning("%s (%s) is left out: %s", name, backend(fmt), why)
            skipped.append({"model": model, "batch": 1, "backend": backend(fmt), "why": why})
    return first


def every_level(
    server: Server,
    names: dict[str, str],
    live: list[str],
    body: wire.Body,
    settings: BenchSettings,
    *,
    at_one: Callable[[list[str]], list[ServedPoint]],
    backend: Callable[[str], str],
    timeout: float = 120.0,
    probe: split.Probe | None = None,
    **point: Any,
) -> list[ServedPoint]:
    """Every concurrency level of `settings` for the `live` formats (format → served name
    in `names`), the formats' order rotated per level so none is always measured first.
    Concurrency 1 is the runtime's own (`at_one`: its alternated paths); the others are
    `measure` with the same clients for every runtime. `probe`: the server's stage totals
    (pipeline.bench.split), read around each level to give each row the server's split."""
    points: list[ServedPoint] = []
    served = {backend(f): n for f, n in names.items()}
    for k, level in enumerate(settings.concurrencies):
        order = live[k % len(live) :] + live[: k % len(live)] if live else []
        before = probe() if probe is not None else {}
        with windows(probe) as starts:
            if level == 1:
                got = at_one(order) if order else []
            else:
                got = [
                    measure(
                        server,
                        names[fmt],
                        body,
                        level,
                        settings.requests_per_level,
                        timeout,
                        settings.level_budget_s,
                        backend=backend(fmt),
                        **point,
                    )
                    for fmt in order
                ]
        if probe is not None:
            after = probe()
            for p in got:  # TorchServe's own-port rows share their format's model
                name = served.get(p.backend) or served.get(p.backend.rsplit("/", 1)[0], "")
                p.server_ms = split.between(starts.get(name, before), after, name, p.mean_ms)
        points += got
    return points
