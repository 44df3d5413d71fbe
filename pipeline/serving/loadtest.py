"""A bounded load run against a served model, every answer checked against eager.

`run()` sends `requests` requests at `concurrency` from one asyncio loop
(loopback only), each carrying one of `pool` distinct inputs whose eager
outputs were computed beforehand, and checks every answer with the
manifest's tolerance. It retries what is safe to retry (503 and connection
errors, with a bound and backoff: the client's policy), so that a killed
worker costs time, not answers. Any answer of 500 or more that is left after
the retries is counted apart (`server_errors`) and fails the run: no request
may earn a 5xx. `encodings` sends the inputs as JSON or `.npy`/`.npz`, with
their own Content-Type, none, or curl's default form type, in turn. Optionally it SIGKILLs the model's worker
part-way through and measures how long the runtime takes to bring a new one
up. Worker memory (RSS of the model's worker processes) is read once after
warm-up and once at the end.

`run_served()` is the whole `pipeline loadtest` workflow: against the running
server, or against a private one (the runtime's `private`: the export served on free
loopback ports from a temporary folder, run, stop). Each runtime's protocol builds the
request bodies and its `worker_pids` says which processes to read memory from and kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import torch

from pipeline.core.compare import compare_tensor
from pipeline.core.errors import PipelineError
from pipeline.export.opened import ExportedModel, open_export
from pipeline.serving import client, runtime, served, wire
from pipeline.serving.loadjudge import ByVersion, UncheckedVersionError, pooled_for
from pipeline.serving.loadkills import (
    NodeKill,
    kill_refusal,
    node_kill_refusal,
    private_kill_refusal,
)
from pipeline.serving.loadreport import LoadReport
from pipeline.serving.server import Server, default_run_dir

log = logging.getLogger(__name__)


class LoadTestError(PipelineError):
    """The load run could not be set up."""


# name -> (body format, Content-Type): "" sends none, and the form type is what
# curl sends with --data-binary unless told otherwise; the gateway recognises
# every body by its content.
ENCODINGS = {
    "json": ("json", "application/json"),
    "npy": ("npy", "application/octet-stream"),
    "json-untyped": ("json", ""),
    "npy-untyped": ("npy", ""),
    "json-form": ("json", "application/x-www-form-urlencoded"),
    "npy-form": ("npy", "application/x-www-form-urlencoded"),
}


@dataclass
class LoadConfig:
    export_dir: Path
    # The served name (e.g. digits_lenet_ts); None: the export's model in
    # `format`, found in what serve recorded.
    served: str | None = None
    run_dir: Path | None = None  # the running server's; None: <artifacts>/serve
    # None: whichever format the server serves (client.resolve_model); a private
    # server serves the one `pipeline serve` would (served.export_format).
    format: str | None = None
    requests: int = 20_000
    concurrency: int = 32
    time_limit_s: float = 600.0
    pool: int = 64  # distinct inputs, each answer checked against its eager output
    kill_worker_after: int | None = None  # SIGKILL the worker once this many were answered
    # Kill a worker node that serves the model once this many were answered (a runtime with
    # the `nodes` capability: a cluster's machine lost under load).
    kill_node_after: int | None = None
    retries: int = 8  # resends per request, with the client's backoff
    seed: int = 0
    # How bodies are sent, in turn (ENCODINGS): the default is JSON as application/json.
    encodings: tuple[str, ...] = ("json",)
    # The private server's runtime (run_served(private=True)); None: `pipeline serve`'s default.
    runtime: str | None = None
    # A versioned store: each answer is checked against eager of the version it names
    # (across a rollout, canary and rollback); None: every answer against `export_dir`'s.
    store: Path | None = None

    def validate(self) -> None:
        if self.requests < 1 or self.concurrency < 1:
            raise LoadTestError("--requests and --concurrency must be at least 1.")
        if self.pool < 1:  # not a command-line option
            raise LoadTestError("A load run needs at least one distinct input (pool).")
        if self.time_limit_s <= 0:
            raise LoadTestError("--time-limit must be positive.")
        if self.kill_worker_after is not None and not 0 <= self.kill_worker_after < self.requests:
            raise LoadTestError("--kill-worker-after must be between 0 and --requests - 1.")
        if self.kill_node_after is not None and not 0 <= self.kill_node_after < self.requests:
            raise LoadTestError("--kill-node-after must be between 0 and --requests - 1.")
        if self.kill_node_after is not None and self.kill_worker_after is not None:
            raise LoadTestError("Kill a worker or a node in one run, not both.")
        unknown = [e for e in self.encodings if e not in ENCODINGS]
        if unknown or not self.encodings:
            raise LoadTestError(
                f"Unknown encoding(s) {unknown}: pick from {', '.join(ENCODINGS)} (e.g. json,npy-form)."
            )


def worker_pids(server: Server, name: str) -> list[int]:
    """The pids of the processes that answer served `name` (its runtime says which)."""
    return runtime.of(server).worker_pids(server, name)


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


def _inputs_pool(
    config: LoadConfig, exported: ExportedModel, rt: runtime.Runtime
) -> tuple[list[wire.Body], ByVersion]:
    """`pool` bodies in `rt`'s protocol with the eager outputs each must get back: by the
    version that answers (`exported`'s; with `config.store`, each answering version's own,
    its folder opened when it first answers)."""
    bodies, pool = [], []
    for i in range(config.pool):
        inputs = exported.sample(1, seed=config.seed + i)
        kind, content_type = ENCODINGS[config.encodings[i % len(config.encodings)]]
        body = rt.protocol.encode(inputs, binary=kind == "npy")
        bodies.append(rt.protocol.encode_as(body, content_type))
        pool.append(inputs)
    return bodies, ByVersion(exported, pool, config.store)


def _json_infinities(response: Any, eager: dict, got: dict) -> dict:
    """`got` with eager's Inf where a JSON answer said null (JSON has no Infinity: the
    servers write NaN and Inf as null, read back as NaN); a binary answer carries them."""
    if "inference-header-content-length" in response.headers:
        return got
    fixed = {}
    for name, value in got.items():
        ref = eager.get(name)
        if ref is not None and value.is_floating_point() and value.shape == ref.shape:
            value = torch.where(value.isnan() & ref.isinf(), ref.to(value.dtype), value)
        fixed[name] = value
    return fixed


async def _watch_recovery(
    server: Server, name: str, killed: int, count: int, started: float
) -> float | None:
    """Seconds from the kill until `count` READY workers again, none of them the killed one."""
    deadline = started + 120
    while time.monotonic() < deadline:
        try:
            pids = await asyncio.to_thread(worker_pids, server, name)
        except (httpx.HTTPError, LoadTestError):
            pids = []
        if len(pids) >= count and killed not in pids:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    return None


async def _run(
    config: LoadConfig, server: Server, name: str, report: LoadReport, exported: ExportedModel
) -> None:
    bodies, expected = _inputs_pool(config, exported, runtime.of(server))
    tolerance, outputs = exported.manifest.tolerance, exported.manifest.outputs
    served_as = server.served.get(name)
    # int8/float16: pooled and held to the task-level SQNR, not elementwise (loadjudge).
    pooled = pooled_for(exported, served_as.format if served_as else None)
    latencies: list[float] = []
    next_index = 0
    recovery: asyncio.Task | None = None
    node_kill = NodeKill()

    async def one(http: client.AsyncClient, i: int) -> None:
        nonlocal recovery
        k = i % len(bodies)
        t0 = time.perf_counter()
        body = bodies[k]
        answer = await http.send(name, body.content, body.content_type, body.headers)
        latencies.append((time.perf_counter() - t0) * 1e3)
        report.retried += answer.retries
        if not answer.ok:
            report.failed += 1
            if node_kill.at is not None:
                report.failed_after_kill += 1
                node_kill.last_failure = time.monotonic()
            if answer.response is not None and answer.response.status_code >= 500:
                report.server_errors += 1
            if len(report.errors) < 5:
                report.errors.append(f"request {i}: {answer.problem}")
            return
        report.answered += 1
        try:
            named = wire.answer_version(answer.response)
            report.by_version[str(named)] = report.by_version.get(str(named), 0) + 1
            eager = (await expected.of(named))[k]
            got = _json_infinities(
                answer.response, eager, runtime.of(server).protocol.answer(answer.response)
            )
            if pooled is not None:
                problem = pooled.add(eager, got)
                ok = not problem
            else:
                ok = all(
                    compare_tensor(
                        eager[o.name],
                        got[o.name].to(getattr(torch, o.dtype)),
                        tolerance.atol,
                        tolerance.rtol,
                    ).passed
                    for o in outputs
                )
                problem = "outputs outside tolerance"
        except UncheckedVersionError as err:
            ok, problem = False, str(err)
        except (ValueError, KeyError, TypeError, RuntimeError) as err:
            ok, problem = False, f"unreadable answer: {err}"
        if not ok:
            report.wrong += 1
            if len(report.errors) < 5:
                report.errors.append(f"request {i}: {problem}")
        elif node_kill.at is not None and t0 >= node_kill.at_perf:
            node_kill.answered_at.append(time.monotonic())
        if (
            config.kill_node_after is not None
            and node_kill.at is None
            and report.answered >= config.kill_node_after
        ):
            node_kill.at, node_kill.at_perf = time.monotonic(), time.perf_counter()
            nodes = runtime.of(server).nodes
            assert nodes is not None  # run() refused a runtime without
            try:
                report.killed_node = await asyncio.to_thread(nodes.kill_node, server, name)
            except ValueError as err:  # no node it may kill (one machine, another's cluster)
                raise LoadTestError(f"--kill-node-after: {err}.") from None
            log.info("killed node %s, which served %s", report.killed_node, name)
        if (
            config.kill_worker_after is not None
            and report.killed_pid is None
            and report.answered >= config.kill_worker_after
        ):
            pids = worker_pids(server, name)
            report.killed_pid = pids[0]
            os.kill(pids[0], signal.SIGKILL)
            log.info("SIGKILLed worker %d of %s", pids[0], name)
            recovery = asyncio.create_task(
                _watch_recovery(server, name, pids[0], len(pids), time.monotonic())
            )

    async def lane(http: client.AsyncClient, deadline: float) -> None:
        nonlocal next_index
        while next_index < config.requests and time.monotonic() < deadline:
            i = next_index
            next_index += 1
            await one(http, i)

    async with client.AsyncClient(
        server, concurrency=config.concurrency, timeout=60.0, retries=config.retries
    ) as http:
        # Warm-up: connections open, the worker past its first calls; then memory.
        await asyncio.gather(*(one(http, -1 - j) for j in range(config.concurrency)))
        warm_failed, warm_wrong = report.failed, report.wrong
        # server_errors is not reset: a 5xx during warm-up fails the run too.
        report.answered = report.failed = report.wrong = report.retried = 0
        report.by_version.clear()
        report.errors.clear()  # the run's own first errors, not the warm-up's
        if pooled is not None:
            pooled.reset()
        if warm_failed:
            report.errors.append(f"{warm_failed} warm-up request(s) failed")
        if warm_wrong:
            report.errors.append(f"{warm_wrong} warm-up answer(s) wrong")
        latencies.clear()
        report.worker_pids_before = worker_pids(server, name)
        report.worker_rss_mb_before = _rss_mb(report.worker_pids_before)
        began = time.monotonic()
        await asyncio.gather(
            *(lane(http, began + config.time_limit_s) for _ in range(config.concurrency))
        )
        report.duration_s = time.monotonic() - began
    if recovery is not None:
        report.recovery_s = await recovery
    report.node_recovery_s = node_kill.recovery_s()
    if pooled is not None:
        report.judged = [v.to_json() | {"said": v.describe()} for v in pooled.verdicts()]
        report.judged_as = f"{pooled.fmt} ({pooled.precision})"
        report.agreement = pooled.agreement()
    report.not_sent = config.requests - next_index
    report.throughput_rps = report.answered / report.duration_s if report.duration_s else 0.0
    report.p50_ms = _percentile(latencies, 50)
    report.p90_ms = _percentile(latencies, 90)
    report.p99_ms = _percentile(latencies, 99)
    report.worker_pids_after = worker_pids(server, name)
    report.worker_rss_mb_after = _rss_mb(report.worker_pids_after)


def _refuse_kills(config: LoadConfig, rt: runtime.Runtime) -> None:
    refused = kill_refusal(config.encodings, config.kill_worker_after, config.kill_node_after, rt)
    if refused:
        raise LoadTestError(refused)


def run(
    config: LoadConfig,
    exported: ExportedModel | None = None,
    say: Callable[[str], Any] = log.debug,
) -> LoadReport:
    """One load run against the server recorded in `config.run_dir`. `exported`: the
    export in `config.export_dir`, when the caller has opened it. `say` hears the run's
    start, once every option and the server have been checked."""
    config.validate()
    server = Server.load(Path(config.run_dir or default_run_dir()))
    if not server.alive():
        raise LoadTestError(f"The server recorded in {server.run_dir} is not running.")
    if config.served is not None and config.served not in server.models:
        raise LoadTestError(
            f"The server does not serve {config.served}; it serves {', '.join(server.models)}."
        )
    rt = runtime.of(server)
    _refuse_kills(config, rt)
    exported = exported or open_export(config.export_dir)
    name = config.served or client.resolve_model(server, exported.name, config.format)
    # Before any load: a kill that would take the last node serving the model fails
    # every request after it (a second run after one node was lost killed the other).
    refused = node_kill_refusal(rt, server, name) if config.kill_node_after is not None else None
    if refused:
        raise LoadTestError(refused)
    # Every answer would be checked against another model's outputs: say why, not "wrong".
    # By version, each answer is checked against the version it names, whatever was served
    # at start (a rollout since changes what the server's record says).
    fresh, why = served.freshness(
        server.served, name, exported.dir, manifest=exported.manifest, server=server
    )
    if fresh is False and config.store is None:
        raise LoadTestError(why)
    report = LoadReport(name, config.requests, config.concurrency)
    report.checked_by_version = config.store is not None
    say(f"{config.requests} requests at concurrency {config.concurrency} ...")
    asyncio.run(_run(config, server, name, report, exported))
    return report


def run_served(
    config: LoadConfig, *, private: bool = False, say: Callable[[str], Any] = log.info
) -> LoadReport:
    """`pipeline loadtest`: `run()` against the running server or, with `private`, against a
    server of its own (the export in `config.format`, by default the format `pipeline
    serve` would serve, served on free loopback ports, stopped afterwards)."""
    if not private:
        return run(config, say=say)
    rt = runtime.get(config.runtime or runtime.default())
    config.validate()  # before a server is started for it: --requests 0 took 8 s to refuse
    _refuse_kills(config, rt)
    refused = private_kill_refusal(config.kill_node_after, rt)
    if refused:  # before the private server, not after its start
        raise LoadTestError(refused)
    exported = open_export(config.export_dir)
    fmt = config.format or served.export_format(exported.manifest)
    say(f"starting a private server ({rt.title}) for {exported.name} ({fmt}) ...")
    with rt.private(exported, fmt) as server:
        return run(replace(config, run_dir=Path(server.run_dir)), exported, say)
