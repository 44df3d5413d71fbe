"""Issue 28's (and 40's) targets against the peers, and where the time goes when one is missed.

Ratios of figures from one bench run only. Our runtime's digits rows are the
peer phase's (the same OIP JSON bodies as the yardstick and LitServe); resnet18's
are the served rows (each format, the runtime's defaults) against in-process
batch 1, the same comparison the runtimes' own targets make.
"""

from __future__ import annotations

from typing import Any

from pipeline.bench.inprocess import ONE_THREAD
from pipeline.bench.peers import FORMAT, LITSERVE, YARDSTICK
from pipeline.bench.split import describe
from pipeline.bench.targets import DIGITS, RESNET, cell, served_at, target
from pipeline.formats import base as registry


def _at(rows: list[dict], model: str, label: str, level: int) -> list[dict]:
    return [
        r
        for r in rows
        if r["model"] == model and r["backend"] == f"{label}/{FORMAT}" and r["concurrency"] == level
    ]


def _per_request_ms(row: dict) -> float:
    """What one request costs at its level: 1000 / requests a second."""
    return 1e3 / row["throughput"]


def _own(figure_ms: float, model_ms: float | None, who: str) -> str:
    if model_ms is None:
        return f"{who} {figure_ms:.2f} ms"
    own = figure_ms - model_ms
    return f"{who} {figure_ms:.2f} ms, {own:.2f} ms ({own / figure_ms:.0%}) its own"


def peer_targets(
    cells: list[dict], served: list[dict], peers: list[dict], ours: list[str]
) -> list[dict[str, Any]]:
    """The four targets for each runtime in `ours`; a missed one carries `where`: the
    in-process model time against the served figure, i.e. the server's own share."""
    out = []
    onnx = registry.get(FORMAT).backend
    model_cell = cell(cells, DIGITS, f"{onnx}{ONE_THREAD}", 1) or cell(cells, DIGITS, onnx, 1)
    model_ms = model_cell["median_ms"] if model_cell else None
    in_process = f"in-process {model_cell['backend']} {model_ms:.3f} ms" if model_cell else ""
    yard8 = _at(peers, DIGITS, YARDSTICK, 8)
    yard1 = _at(peers, DIGITS, YARDSTICK, 1)
    lit8 = max(_at(peers, DIGITS, LITSERVE, 8), key=lambda r: r["throughput"], default=None)
    for name in ours:
        mine8 = _at(peers, DIGITS, name, 8)
        mine1 = _at(peers, DIGITS, name, 1)
        if mine8 and yard8:
            a, b = mine8[0], yard8[0]
            out.append(
                _versus(
                    f"{DIGITS} {name}/{FORMAT} at concurrency 8: ≥ 1.0× the yardstick's req/s",
                    a["throughput"] / b["throughput"],
                    1.0,
                    at_least=True,
                    detail=f"{a['throughput']:.0f} vs {b['throughput']:.0f} req/s",
                    where=_c8_where(a, b, "the yardstick", model_ms, in_process),
                )
            )
        if mine8 and lit8:
            a = mine8[0]
            out.append(
                _versus(
                    f"{DIGITS} {name}/{FORMAT} at concurrency 8: ≥ 2× LitServe's req/s (its better batching)",
                    a["throughput"] / lit8["throughput"],
                    2.0,
                    at_least=True,
                    detail=f"{a['throughput']:.0f} vs {lit8['throughput']:.0f} req/s, LitServe batching {lit8['batching']}",
                    where=_c8_where(a, lit8, "LitServe", model_ms, in_process),
                )
            )
        if mine1 and yard1:
            a, b = mine1[0], yard1[0]
            out.append(
                _versus(
                    f"{DIGITS} {name}/{FORMAT} p50 at concurrency 1: ≤ 1.2× the yardstick's",
                    a["median_ms"] / b["median_ms"],
                    1.2,
                    detail=f"{a['median_ms']:.2f} vs {b['median_ms']:.2f} ms",
                    where=f"p50: {_own(a['median_ms'], model_ms, name)}; "
                    f"{_own(b['median_ms'], model_ms, 'the yardstick')}; {in_process}"
                    + (f"; {_split(a)}" if _split(a) else ""),
                )
            )
        out += _resnet(cells, served, name)
    return out


def _c8_where(a: dict, b: dict, peer: str, model_ms: float | None, in_process: str) -> str:
    parts = (
        f"a request at concurrency 8 (1000 / req/s): {_own(_per_request_ms(a), model_ms, 'ours')}",
        _own(_per_request_ms(b), model_ms, peer),
        in_process,
        _split(a),
    )
    return "; ".join(p for p in parts if p)


def _split(row: dict) -> str:
    """Our row's own split of its mean latency (pipeline.bench.split), when it has one."""
    said = describe(row.get("server_ms"))
    return f"our server's split of a request: {said}" if said else ""


def _resnet(cells: list[dict], served: list[dict], name: str) -> list[dict[str, Any]]:
    out = []
    for fmt in registry.all_formats():
        s8 = served_at(served, RESNET, fmt.key, 8, "on", name)
        inproc = cell(cells, RESNET, fmt.backend, 1)
        if not (s8 and inproc):
            continue
        served_ms, model_ms = _per_request_ms(s8), _per_request_ms(inproc)
        out.append(
            _versus(
                f"{RESNET} {name}/{fmt.key} at concurrency 8: ≥ 0.95 of in-process {fmt.backend} (batch 1)",
                s8["throughput"] / inproc["throughput"],
                0.95,
                at_least=True,
                detail=f"{s8['throughput']:.1f} vs {inproc['throughput']:.1f} samples/s",
                where=f"a request at concurrency 8: {_own(served_ms, model_ms, 'served')}; "
                f"in-process {fmt.backend} ({inproc['threads']} threads) {model_ms:.2f} ms",
            )
        )
    return out


def _versus(
    name: str, value: float, bound: float, *, detail: str, where: str, at_least: bool = False
) -> dict[str, Any]:
    met = value >= bound if at_least else value <= bound
    return target(name, value, detail, met) | {"where": where}


def lines(targets: list[dict[str, Any]]) -> list[str]:
    """PASS/MISS lines with the ratio; under a miss, where the time goes."""
    out = []
    for t in targets:
        out.append(
            f"{'PASS' if t['met'] else 'MISS'} {t['target']}: {t['value']:.2f}× ({t['detail']})"
        )
        if not t["met"]:
            out.append(f"     where the time goes: {t['where']}")
    return out


def markdown(peers: list[dict], settings: dict[str, dict], targets: list[dict]) -> str:
    """The peer rows, how each server ran, and the target lines, for bench.md."""
    if not peers and not targets:
        return ""
    from pipeline.bench.report import served_rows_markdown

    title = "Peers (the same ONNX file, OIP JSON bodies and clients; each server alone)"
    parts = [served_rows_markdown(title, peers)]
    if settings:
        parts.append(
            "\n".join(
                f"* {k}: " + ", ".join(f"{n} {v}" for n, v in s.items())
                for k, s in settings.items()
            )
        )
    if targets:
        parts.append("#### Peer targets (issue 28)\n\n```\n" + "\n".join(lines(targets)) + "\n```")
    return "\n\n".join(p for p in parts if p)
