"""The issue's performance targets, as ratios from one bench run.

None is asserted by a test (they depend on the machine); bench.json and
bench.md report each with its value and whether it was met. The formats and
their backend names come from the registry, so a new format gets the same
targets as the built-in ones.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.bench.inprocess import ONE_THREAD
from pipeline.formats import base as registry
from pipeline.verify.backends import cpp_backend_name

RESNET = "torchvision:resnet18"
DIGITS = "digits_lenet"
KSERVE = "kserve"  # backend prefix of the KServe runtime's served points
DIRECT = "torchserve-direct"  # backend prefix of served points on TorchServe's own port
OPSET = re.compile(r"^(?P<base>.+) \(opset (?P<opset>\d+)\)$")  # "onnxruntime (opset 20)"


def _cell(cells: list[dict], model: str, backend: str, batch: int) -> dict | None:
    return next(
        (
            c
            for c in cells
            if c["model"] == model and c["backend"] == backend and c["batch"] == batch
        ),
        None,
    )


def _served_at(
    served: list[dict],
    model: str,
    fmt: str,
    concurrency: int,
    batching: str,
    prefix: str = "torchserve",
) -> dict | None:
    return next(
        (
            s
            for s in served
            if s["model"] == model
            and s["backend"] == f"{prefix}/{fmt}"
            and s["concurrency"] == concurrency
            and s["batching"] == batching
        ),
        None,
    )


def _target(target: str, value: float, detail: str, met: bool) -> dict[str, Any]:
    return {"target": target, "value": value, "detail": detail, "met": met}


def targets(cells: list[dict], served: list[dict], peak: float) -> list[dict[str, Any]]:
    """Every target the run has the figures for (bench.json rows in, target rows out)."""
    return [
        *_peak(cells, peak),
        *_serving_cost(cells, served),
        *_edges(served),
        *_kserve(cells, served),
        *_opsets(cells),
        *_first_request(served),
        *_cpp(cells),
    ]


def _peak(cells: list[dict], peak: float) -> list[dict[str, Any]]:
    r32 = [c for c in cells if c["model"] == RESNET and c["batch"] == 32]
    r32 = [c for c in r32 if c.get("verified") and c.get("peak_fraction") is not None]
    if not r32:
        return []
    best = max(r32, key=lambda c: c["peak_fraction"])
    return [
        _target(
            "resnet18 batch 32: fastest verified backend ≥ 85% of fp32 matmul peak",
            best["peak_fraction"],
            f"{best['backend']}: {best['gflops']:.1f} of {peak:.1f} GFLOP/s",
            best["peak_fraction"] >= 0.85,
        )
    ]


def _serving_cost(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """Each served format against its own backend in-process: throughput, added latency."""
    out = []
    formats = registry.all_formats()
    for fmt in formats:
        inproc = _cell(cells, RESNET, fmt.backend, 1)
        at8 = _served_at(served, RESNET, fmt.key, 8, "on")
        if inproc and at8:
            ratio = at8["throughput"] / inproc["throughput"]
            out.append(
                _target(
                    f"TorchServe/{fmt.key} at concurrency 8, resnet18: ≥ 85% of in-process {fmt.backend} throughput (batch 1)",
                    ratio,
                    f"{at8['throughput']:.1f} vs {inproc['throughput']:.1f} samples/s",
                    ratio >= 0.85,
                )
            )
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in formats:
            # The single-threaded twin where there is one: the workers run one thread.
            inproc = _cell(cells, model, f"{fmt.backend}{ONE_THREAD}", 1) or _cell(
                cells, model, fmt.backend, 1
            )
            at1 = _served_at(served, model, fmt.key, 1, "off")
            if inproc and at1:
                added = at1["median_ms"] - inproc["median_ms"]
                out.append(
                    _target(
                        f"{model} TorchServe/{fmt.key} added p50 latency at concurrency 1 ≤ 5 ms (vs in-process, {inproc['threads']} thread(s) like the worker)",
                        added,
                        f"{at1['median_ms']:.2f} vs {inproc['median_ms']:.2f} ms in-process",
                        added <= 5.0,
                    )
                )
    return out


def _edges(served: list[dict]) -> list[dict[str, Any]]:
    """Batching without waiting and a cheap gateway (all figures from one server run each).

    "on" is the archive defaults, "off" batch size 1, "old" the defaults before
    they were measured (batch 8, 10 ms); direct is TorchServe's own port.
    """
    out = []
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in registry.all_formats():
            on1 = _served_at(served, model, fmt.key, 1, "on")
            off1 = _served_at(served, model, fmt.key, 1, "off")
            direct_off = _served_at(served, model, fmt.key, 1, "off", DIRECT)
            if on1 and direct_off:
                ratio = on1["median_ms"] / direct_off["median_ms"]
                out.append(
                    _target(
                        f"{model} {fmt.key}: served p50 at concurrency 1 (archive defaults, through the gateway) ≤ 1.1× TorchServe's own port with batching off",
                        ratio,
                        f"{on1['median_ms']:.2f} vs {direct_off['median_ms']:.2f} ms",
                        ratio <= 1.1,
                    )
                )
            if on1 and off1:
                wait = on1["median_ms"] - off1["median_ms"]
                out.append(
                    _target(
                        f"{model} {fmt.key}: a lone request waits ≤ 1 ms for a batch (p50 at concurrency 1, archive defaults − batching off, both through the gateway)",
                        wait,
                        f"{on1['median_ms']:.2f} vs {off1['median_ms']:.2f} ms",
                        wait <= 1.0,
                    )
                )
            if off1 and direct_off:
                cost = off1["median_ms"] - direct_off["median_ms"]
                out.append(
                    _target(
                        f"{model} {fmt.key}: gateway cost ≤ 0.5 ms (p50 at concurrency 1, gateway − TorchServe's own port, batching off)",
                        cost,
                        f"{off1['median_ms']:.2f} vs {direct_off['median_ms']:.2f} ms",
                        cost <= 0.5,
                    )
                )
            on8 = _served_at(served, model, fmt.key, 8, "on")
            old8 = _served_at(served, model, fmt.key, 8, "old")
            if on8 and old8:
                ratio = on8["throughput"] / old8["throughput"]
                out.append(
                    _target(
                        f"{model} {fmt.key}: throughput at concurrency 8 with the archive defaults ≥ the old defaults (batch 8, 10 ms)",
                        ratio,
                        f"{on8['throughput']:.0f} vs {old8['throughput']:.0f} requests/s",
                        ratio >= 1.0,
                    )
                )
    return out


def _kserve(cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
    """The KServe runtime against TorchServe (same run, same exports, same clients) and,
    for resnet18, against its own format in-process."""
    out = []
    for model in dict.fromkeys(s["model"] for s in served):
        for fmt in registry.all_formats():
            k1 = _served_at(served, model, fmt.key, 1, "on", KSERVE)
            ts1 = _served_at(served, model, fmt.key, 1, "on")
            if k1 and model == DIGITS:
                versus = f"; TorchServe {ts1['median_ms']:.2f} ms" if ts1 else ""
                out.append(
                    _target(
                        f"{model} kserve/{fmt.key}: p50 at concurrency 1 ≤ 2 ms",
                        k1["median_ms"],
                        f"{k1['median_ms']:.2f} ms{versus}",
                        k1["median_ms"] <= 2.0,
                    )
                )
            k8 = _served_at(served, model, fmt.key, 8, "on", KSERVE)
            ts8 = _served_at(served, model, fmt.key, 8, "on")
            if k8 and ts8:
                ratio = k8["throughput"] / ts8["throughput"]
                out.append(
                    _target(
                        f"{model} kserve/{fmt.key}: throughput at concurrency 8 ≥ 3× TorchServe's (archive defaults)",
                        ratio,
                        f"{k8['throughput']:.0f} vs {ts8['throughput']:.0f} requests/s",
                        ratio >= 3.0,
                    )
                )
            inproc = _cell(cells, model, fmt.backend, 1)
            if k8 and inproc and model == RESNET:
                ratio = k8["throughput"] / inproc["throughput"]
                out.append(
                    _target(
                        f"{model} kserve/{fmt.key}: throughput at concurrency 8 ≥ 0.9× in-process {fmt.backend} (batch 1)",
                        ratio,
                        f"{k8['throughput']:.1f} vs {inproc['throughput']:.1f} samples/s",
                        ratio >= 0.9,
                    )
                )
    return out


def _opsets(cells: list[dict]) -> list[dict[str, Any]]:
    """The exported ONNX opset against each conversion bench measured beside it."""
    out = []
    for other in sorted(cells, key=lambda c: (c["model"], c["batch"])):
        match = OPSET.match(other["backend"])
        base = match and _cell(cells, other["model"], match["base"], other["batch"])
        if not base:
            continue
        fmt = registry.by_backend(match["base"])
        ratio = base["median_ms"] / other["median_ms"]
        out.append(
            _target(
                f"{other['model']} batch {other['batch']}: the exported {fmt.title if fmt else match['base']} opset is at least as fast as opset {match['opset']}",
                ratio,
                f"{base['median_ms']:.3f} ms exported vs {other['median_ms']:.3f} ms",
                ratio <= 1.05,  # within noise, or faster
            )
        )
    return out


def _first_request(served: list[dict]) -> list[dict[str, Any]]:
    return [
        _target(
            f"{s['model']} {s['backend']} (batching {s['batching']}): first request after READY ≤ 2× a steady one",
            s["first_request_ms"] / s["median_ms"],
            f"{s['first_request_ms']:.1f} vs {s['median_ms']:.1f} ms p50",
            s["first_request_ms"] / s["median_ms"] <= 2.0,
        )
        for s in served
        if s.get("first_request_ms") is not None
    ]


def _cpp(cells: list[dict]) -> list[dict[str, Any]]:
    """The C++ client against Python on the same artifact, for each format the client runs."""
    out = []
    for model in sorted({c["model"] for c in cells}):
        for fmt in (f for f in registry.all_formats() if f.cpp):
            cpp = _cell(cells, model, cpp_backend_name(fmt), 1)
            py = _cell(cells, model, fmt.backend, 1)
            if cpp and py:
                ratio = cpp["median_ms"] / py["median_ms"]
                out.append(
                    _target(
                        f"{model}: C++ client latency ≤ 1.05× Python, both on {fmt.title} (batch 1)",
                        ratio,
                        f"{cpp['median_ms']:.3f} vs {py['median_ms']:.3f} ms",
                        ratio <= 1.05,
                    )
                )
    return out
