"""Served throughput and latency: TorchServe (behind the gateway) per format,
concurrency and dynamic batching setting.

Batching settings (`BATCHING`): "off" (batch size 1), "on" (the archive
defaults, as `pipeline archive` writes them) and "old" (batch 8 with a 10 ms
delay, the defaults before they were chosen by measurement; kept so the
throughput target compares against them in the same run). At concurrency 1
each format is also measured on TorchServe's own port (backend
`torchserve-direct/<format>`, same server, same key), interleaved with the
gateway, so the gateway's cost is a difference of two figures from one run.

One private server per batching setting serves every format of a model that
its export holds (TorchScript, ONNX, and the .pt2 when exported); the formats
are measured in turn within each concurrency level (interleaved, so a noisy
neighbour slows them alike). Each request carries the same one-sample
body, and a sample of answers is checked against the first so a broken
server cannot look fast. A format whose first answer fails or is wrong is
left out of that server's measurements and reported as skipped, with why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import logging
import ssl
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import psutil
import torch

from pipeline.bench.targets import DIRECT
from pipeline.core.compare import compare_outputs
from pipeline.core.errors import PipelineError
from pipeline.export.opened import open_export
from pipeline.serving import client
from pipeline.serving.archive import ArchiveConfig, archive
from pipeline.serving.torchserve import Server, private_config, start, stop

log = logging.getLogger(__name__)

# Warm-up per format and level: one request per client opens its connection and
# fills the worker's batch path; two per client (64 resnet18 requests at 32
# clients) took 3 s a level and a minute of `make bench` for no change in p50.
WARMUP_BUDGET_S = 1.5

# Batching setting → (batch size, max batch delay in ms) of the archives measured.
BATCHING: dict[str, tuple[int, int]] = {
    "off": (1, 0),
    "on": (ArchiveConfig.batch_size, ArchiveConfig.max_batch_delay_ms),
    "old": (8, 10),
}


@dataclass
class ServedPoint:
    model: str
    backend: str  # torchserve/<format>, or torchserve-direct/<format> (no gateway)
    batching: str  # a key of BATCHING
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
            p90_ms=float(np.percentile(arr, 90)),
            p99_ms=float(np.percentile(arr, 99)),
            throughput=(len(arr) - failed) / elapsed_s,
            **point,
        )


async def _load(
    server: Server,
    name: str,
    body: bytes,
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

        async def lane() -> None:
            nonlocal left, failed
            while left > 0 and (deadline is None or time.perf_counter() < deadline):
                left -= 1
                t0 = time.perf_counter()
                answer = await http.send(name, body, "application/octet-stream")
                latencies.append((time.perf_counter() - t0) * 1e3)
                failed += not answer.ok

        start_t = time.perf_counter()
        deadline = start_t + budget_s if budget_s else None
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start_t
    return latencies, failed, elapsed


def _check_answer(
    server: Server, name: str, body: bytes, expected: dict[str, torch.Tensor]
) -> float:
    """The first request after READY: checked against eager; returns its latency (ms).

    The client is built before the clock starts (building one costs more than
    a request), so the figure is the server's first-request cost.
    """
    with client.Client(server, timeout=120, retries=0) as http:
        t0 = time.perf_counter()
        answer = http.send(name, body, "application/octet-stream")
        elapsed_ms = (time.perf_counter() - t0) * 1e3
    if not answer.ok:
        raise PipelineError(f"{name}: {answer.problem}")
    got = answer.response.json()["outputs"]
    mismatch = compare_outputs(
        list(expected.values()),
        [torch.tensor(got[n]).reshape(e.shape).to(e.dtype) for n, e in expected.items()],
        atol=1e-3,
        rtol=1e-3,
    )
    if mismatch:
        raise PipelineError(
            f"{name} answered outside tolerance ({mismatch}); not benchmarking a wrong server."
        )
    return elapsed_ms


def _direct(server: Server) -> Server:
    """The same server seen without the gateway: TorchServe's own inference port.

    TorchServe checks the same inference key the gateway does, so the client
    needs nothing else.
    """
    return dataclasses.replace(server, inference_url=server.backend_url, ca_file=None)


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


def _sequential_pair(
    server: Server,
    name: str,
    body: bytes,
    requests: int,
    budget_s: float,
    *,
    model: str,
    fmt: str,
    batching: str,
    first_ms: float,
) -> list[ServedPoint]:
    """Concurrency 1 through the gateway and on TorchServe's own port, request by request.

    The client is the leanest there is (one kept-alive `http.client`
    connection each): at concurrency 1 the async client the other levels use
    cost about 1.5 ms a request here, more than the gateway itself, and would
    hide what is measured. Alternating the two paths request by request puts
    them under the same noise, so their difference is the gateway's cost.
    """
    paths = {"torchserve": server, DIRECT: _direct(server)}
    conns = {k: _one_connection(s, timeout=120) for k, s in paths.items()}
    token = server.keys()["inference"]
    headers = {"Content-Type": "application/octet-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    lat: dict[str, list[float]] = {k: [] for k in paths}
    failed = dict.fromkeys(paths, 0)
    # Warm-up: at least 10 pairs and WARMUP_BUDGET_S. The gateway's cost fell from
    # about 0.8 to 0.55 ms over the first few hundred pairs here.
    warm_until = time.perf_counter() + WARMUP_BUDGET_S
    pairs, measured, deadline = 0, False, 0.0
    try:
        while True:
            if not measured and pairs >= 10 and time.perf_counter() > warm_until:
                measured, pairs, deadline = True, 0, time.perf_counter() + budget_s
            if measured and (pairs >= requests or time.perf_counter() > deadline):
                break
            pairs += 1
            for key, conn in conns.items():
                t0 = time.perf_counter()
                try:
                    conn.request("POST", f"/predictions/{name}", body=body, headers=headers)
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
    points = []
    for key in paths:
        points.append(
            ServedPoint.of(
                lat[key],
                failed[key],
                float(np.sum(lat[key])) / 1e3,  # sequential: the requests' own time
                model=model,
                backend=f"{key}/{fmt}",
                batching=batching,
                concurrency=1,
                first_request_ms=first_ms if key != DIRECT else None,
            )
        )
    return points


def _measure(
    server: Server,
    name: str,
    body: bytes,
    level: int,
    requests: int,
    timeout: float,
    budget_s: float,
    *,
    model: str,
    backend: str,
    batching: str,
    first_ms: float | None,
) -> ServedPoint:
    """Warm up at this level (connections open, the worker's batch path hot), then measure."""
    asyncio.run(_load(server, name, body, level, level, timeout, WARMUP_BUDGET_S))
    lat, failed, elapsed = asyncio.run(
        _load(server, name, body, level, requests, timeout, budget_s)
    )
    return ServedPoint.of(
        lat,
        failed,
        elapsed,
        model=model,
        backend=backend,
        batching=batching,
        concurrency=level,
        first_request_ms=first_ms,
    )


def bench_served(
    model: str,
    export_dir: Path,
    *,
    concurrencies: tuple[int, ...] = (1, 8, 32),
    requests_per_level: int = 200,
    batching: tuple[str, ...] = ("off", "on"),
    timeout: float = 120.0,
    level_budget_s: float = 20.0,
) -> tuple[list[ServedPoint], list[dict[str, Any]]]:
    """Serve `model` (every format it has) once per batching setting and measure each level.

    Returns the points and the formats skipped (model, batch, backend, why).
    """
    exported = open_export(export_dir, model=model)
    formats = tuple(f.key for f in exported.formats())  # every format it holds is measured
    inputs = exported.sample(1, seed=0)
    expected = exported.eager(inputs)
    body = client.numpy_body(inputs)  # binary: JSON text would measure number parsing, not serving
    points: list[ServedPoint] = []
    skipped: list[dict[str, Any]] = []
    for mode in batching:
        batch_size, delay_ms = BATCHING[mode]
        with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
            store, run_dir = Path(tmp) / "store", Path(tmp) / "run"
            mars = archive(
                ArchiveConfig(
                    model=model,
                    export_dir=export_dir,
                    store=store,
                    formats=formats,
                    batch_size=batch_size,
                    max_batch_delay_ms=delay_ms,
                    response_timeout_s=int(timeout),
                )
            )
            server = start(
                private_config(
                    store,
                    run_dir,
                    # Each format as `pipeline serve` runs a model served alone (one
                    # single-threaded worker per core); the idle formats cost nothing.
                    workers_per_model=psutil.cpu_count(logical=False) or 1,
                    threads_per_worker=1,
                )
            )
            try:
                names = {fmt: mar.stem for fmt, mar in zip(formats, mars, strict=True)}
                first: dict[str, float] = {}
                for fmt, name in names.items():
                    try:
                        first[fmt] = _check_answer(server, name, body, expected)
                    except (PipelineError, KeyError, ValueError) as err:
                        why = " ".join(str(err).split())[:200]
                        log.warning("%s (batching %s) is left out: %s", name, mode, why)
                        backend = f"torchserve/{fmt} (batching {mode})"
                        skipped.append({"model": model, "batch": 1, "backend": backend, "why": why})
                live = [f for f in formats if f in first]
                for k, level in enumerate(concurrencies):
                    order = live[k % len(live) :] + live[: k % len(live)] if live else []  # rotated
                    for fmt in order:
                        common = dict(model=model, batching=mode)
                        if level == 1:  # the gateway and TorchServe's own port, alternately
                            points += _sequential_pair(
                                server,
                                names[fmt],
                                body,
                                requests_per_level,
                                level_budget_s,
                                fmt=fmt,
                                first_ms=first[fmt],
                                **common,
                            )
                            continue
                        points.append(
                            _measure(
                                server,
                                names[fmt],
                                body,
                                level,
                                requests_per_level,
                                timeout,
                                level_budget_s,
                                backend=f"torchserve/{fmt}",
                                first_ms=None,
                                **common,
                            )
                        )
            finally:
                stop(run_dir)
    return points, skipped
