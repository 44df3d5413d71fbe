"""A bounded load run against a served model, every answer checked against eager.

`run()` sends `requests` requests at `concurrency` from one asyncio loop
(loopback only), each carrying one of `pool` distinct inputs whose eager
outputs were computed beforehand, and checks every answer with the
manifest's tolerance. It retries what is safe to retry (503 and connection
errors, with a bound and backoff: the client's policy), so that a killed
worker costs time, not answers. Optionally it SIGKILLs the model's worker
part-way through and measures how long TorchServe takes to bring a new one
up. Worker memory (RSS of the model's worker processes) is read once after
warm-up and once at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import torch

from pipeline.client import BACKOFF_S, RETRY_STATUS, tensors_body, tls_context
from pipeline.compare import compare_tensor, flatten_outputs
from pipeline.errors import PipelineError
from pipeline.manifest import read_manifest
from pipeline.serve import Server
from pipeline.verify import load_reference

log = logging.getLogger(__name__)


class LoadTestError(PipelineError):
    """The load run could not be set up."""


@dataclass
class LoadConfig:
    export_dir: Path
    archive: str  # the served archive, e.g. digits_lenet_ts
    run_dir: Path
    requests: int = 20_000
    concurrency: int = 32
    time_limit_s: float = 600.0
    pool: int = 64  # distinct inputs, each answer checked against its eager output
    kill_worker_after: int | None = None  # SIGKILL the worker once this many were answered
    retries: int = 8
    seed: int = 0

    def validate(self) -> None:
        if self.requests < 1 or self.concurrency < 1 or self.pool < 1:
            raise LoadTestError("--requests, --concurrency and --pool must be at least 1.")
        if self.time_limit_s <= 0:
            raise LoadTestError("--time-limit must be positive.")
        if self.kill_worker_after is not None and not 0 <= self.kill_worker_after < self.requests:
            raise LoadTestError("--kill-worker-after must be between 0 and --requests - 1.")


@dataclass
class LoadReport:
    archive: str
    requests: int
    concurrency: int
    answered: int = 0
    failed: int = 0  # answered with an error after every retry, or never answered
    wrong: int = 0  # answered 200 with outputs outside tolerance
    not_sent: int = 0  # left when the time limit ran out
    retried: int = 0  # extra attempts the retry policy made
    duration_s: float = 0.0
    throughput_rps: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    worker_rss_mb_before: float = 0.0
    worker_rss_mb_after: float = 0.0
    worker_pids_before: list[int] = field(default_factory=list)
    worker_pids_after: list[int] = field(default_factory=list)
    killed_pid: int | None = None
    recovery_s: float | None = None  # SIGKILL until a new worker was READY
    errors: list[str] = field(default_factory=list)  # the first few, for the report

    @property
    def passed(self) -> bool:
        return self.failed == 0 and self.wrong == 0 and self.not_sent == 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def summary(self) -> str:
        lines = [
            f"{self.archive}: {self.requests} requests at concurrency {self.concurrency} in "
            f"{self.duration_s:.1f} s ({self.throughput_rps:.0f} req/s)",
            f"  answered {self.answered}, failed {self.failed}, wrong {self.wrong}, "
            f"not sent {self.not_sent}, retries {self.retried}",
            f"  latency p50 {self.p50_ms:.1f} ms, p90 {self.p90_ms:.1f} ms, p99 {self.p99_ms:.1f} ms",
            f"  worker RSS {self.worker_rss_mb_before:.0f} MiB after warm-up, "
            f"{self.worker_rss_mb_after:.0f} MiB at the end",
        ]
        if self.killed_pid is not None:
            recovery = f"{self.recovery_s:.1f} s" if self.recovery_s is not None else "never"
            lines.append(
                f"  worker {self.killed_pid} SIGKILLed; a new worker was READY in {recovery}"
            )
        lines += [f"  error: {e}" for e in self.errors]
        lines.append("  PASSED" if self.passed else "  FAILED")
        return "\n".join(lines)


def worker_pids(server: Server, archive: str) -> list[int]:
    """The pids of `archive`'s workers that TorchServe reports READY."""
    headers = {"Authorization": f"Bearer {server.keys()['management']}"}
    resp = httpx.get(f"{server.management_url}/models/{archive}", headers=headers, timeout=10)
    if resp.status_code != 200:
        raise LoadTestError(f"The server does not serve {archive}: {resp.text[:200]}")
    return sorted(w["pid"] for w in resp.json()[0]["workers"] if w.get("status") == "READY")


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # a worker that just died counts as 0
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def _inputs_pool(config: LoadConfig) -> tuple[list[bytes], list[list[torch.Tensor]], dict]:
    """`pool` request bodies with the eager outputs each must get back."""
    manifest = read_manifest(config.export_dir)
    entry, model = load_reference(config.export_dir, manifest)
    gen = torch.Generator().manual_seed(config.seed)
    bodies, expected = [], []
    with torch.inference_mode():
        for _ in range(config.pool):
            inputs = entry.sample_inputs(entry.sizes(batch=1), gen)
            bodies.append(tensors_body(inputs))
            expected.append(flatten_outputs(model(*inputs.values())))
    return bodies, expected, manifest


async def _watch_recovery(
    server: Server, archive: str, killed: int, count: int, started: float
) -> float | None:
    """Seconds from the kill until `count` READY workers again, none of them the killed one."""
    deadline = started + 120
    while time.monotonic() < deadline:
        try:
            pids = await asyncio.to_thread(worker_pids, server, archive)
        except (httpx.HTTPError, LoadTestError):
            pids = []
        if len(pids) >= count and killed not in pids:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    return None


async def _run(config: LoadConfig, server: Server, report: LoadReport) -> None:
    bodies, expected, manifest = _inputs_pool(config)
    atol = float(manifest["tolerance"]["atol"])
    rtol = float(manifest["tolerance"]["rtol"])
    dtypes = [getattr(torch, o["dtype"]) for o in manifest["outputs"]]
    url = f"{server.inference_url}/predictions/{config.archive}"
    headers = {
        "Authorization": f"Bearer {server.keys()['inference']}",
        "Content-Type": "application/json",
    }
    latencies: list[float] = []
    next_index = 0
    recovery: asyncio.Task | None = None
    limits = httpx.Limits(
        max_connections=config.concurrency, max_keepalive_connections=config.concurrency
    )

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal recovery
        k = i % len(bodies)
        t0 = time.perf_counter()
        resp = None
        problem = ""
        for attempt in range(config.retries + 1):
            if attempt:
                report.retried += 1
                await asyncio.sleep(min(BACKOFF_S * 2 ** (attempt - 1), 2.0))
            try:
                resp = await client.post(url, content=bodies[k], headers=headers)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as err:
                problem = f"{type(err).__name__}: {err}"
                resp = None
                continue
            except httpx.HTTPError as err:  # a timeout: the request may be running, don't resend
                problem = f"{type(err).__name__}: {err}"
                resp = None
                break
            if resp.status_code not in RETRY_STATUS:
                break
            problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
        latencies.append((time.perf_counter() - t0) * 1e3)
        if resp is None or resp.status_code != 200:
            report.failed += 1
            if resp is not None:
                problem = f"HTTP {resp.status_code}: {' '.join(resp.text.split())[:300]}"
            if len(report.errors) < 5:
                report.errors.append(f"request {i}: {problem}")
            return
        report.answered += 1
        try:
            outputs = resp.json()["outputs"]
            got = [torch.tensor(v, dtype=d) for v, d in zip(outputs.values(), dtypes, strict=True)]
            ok = all(
                compare_tensor(e, g, atol, rtol).passed
                for e, g in zip(expected[k], got, strict=True)
            )
        except (ValueError, KeyError, TypeError, RuntimeError) as err:
            ok = False
            problem = f"unreadable answer: {err}"
        else:
            problem = "outputs outside tolerance"
        if not ok:
            report.wrong += 1
            if len(report.errors) < 5:
                report.errors.append(f"request {i}: {problem}")
        if (
            config.kill_worker_after is not None
            and report.killed_pid is None
            and report.answered >= config.kill_worker_after
        ):
            pids = worker_pids(server, config.archive)
            report.killed_pid = pids[0]
            os.kill(pids[0], signal.SIGKILL)
            log.info("SIGKILLed worker %d of %s", pids[0], config.archive)
            recovery = asyncio.create_task(
                _watch_recovery(server, config.archive, pids[0], len(pids), time.monotonic())
            )

    async def lane(client: httpx.AsyncClient, deadline: float) -> None:
        nonlocal next_index
        while next_index < config.requests and time.monotonic() < deadline:
            i = next_index
            next_index += 1
            await one(client, i)

    async with httpx.AsyncClient(timeout=60.0, limits=limits, verify=tls_context(server)) as client:
        # Warm-up: connections open, the worker past its first calls; then memory.
        await asyncio.gather(*(one(client, -1 - j) for j in range(config.concurrency)))
        warm_failed = report.failed
        report.answered = report.failed = report.wrong = report.retried = 0
        if warm_failed:
            report.errors.append(f"{warm_failed} warm-up request(s) failed")
        latencies.clear()
        report.worker_pids_before = worker_pids(server, config.archive)
        report.worker_rss_mb_before = _rss_mb(report.worker_pids_before)
        start = time.monotonic()
        await asyncio.gather(
            *(lane(client, start + config.time_limit_s) for _ in range(config.concurrency))
        )
        report.duration_s = time.monotonic() - start
    if recovery is not None:
        report.recovery_s = await recovery
    report.not_sent = config.requests - next_index
    report.throughput_rps = report.answered / report.duration_s if report.duration_s else 0.0
    report.p50_ms = _percentile(latencies, 50)
    report.p90_ms = _percentile(latencies, 90)
    report.p99_ms = _percentile(latencies, 99)
    report.worker_pids_after = worker_pids(server, config.archive)
    report.worker_rss_mb_after = _rss_mb(report.worker_pids_after)


def run(config: LoadConfig) -> LoadReport:
    """One load run against the server recorded in `config.run_dir`."""
    config.validate()
    server = Server.load(Path(config.run_dir))
    if not server.alive():
        raise LoadTestError(f"The server recorded in {config.run_dir} is not running.")
    if config.archive not in server.models:
        raise LoadTestError(
            f"The server does not serve {config.archive}; it serves {', '.join(server.models)}."
        )
    report = LoadReport(config.archive, config.requests, config.concurrency)
    asyncio.run(_run(config, server, report))
    return report


def write_reports(reports: list[LoadReport], path: Path) -> None:
    from pipeline.fileio import write_json

    write_json(path, {"runs": [r.to_json() for r in reports]})


def to_markdown(reports: list[LoadReport]) -> str:
    rows = [
        "| archive | requests | concurrency | failed | wrong | retries | req/s | p50 ms | p99 ms "
        "| worker RSS MiB (warm → end) | recovery after SIGKILL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in reports:
        recovery = (
            "—"
            if r.killed_pid is None
            else (f"{r.recovery_s:.1f} s" if r.recovery_s is not None else "never")
        )
        rows.append(
            f"| {r.archive} | {r.requests} | {r.concurrency} | {r.failed + r.not_sent} | {r.wrong} "
            f"| {r.retried} | {r.throughput_rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {r.worker_rss_mb_before:.0f} → {r.worker_rss_mb_after:.0f} | {recovery} |"
        )
    return "\n".join(rows)


def dumps(report: LoadReport) -> str:
    return json.dumps(report.to_json(), indent=2)
