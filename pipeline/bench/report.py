"""The benchmark as a Markdown section and two PNG charts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.bench.inprocess import Cell
from pipeline.core.fileio import atomic_write


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def to_markdown(cells: list[Cell], machine: dict[str, Any], peak_gflops: float | None) -> str:
    lines = [
        f"Machine: {machine.get('cpu')} ({machine.get('cores_physical')} physical cores, "
        f"flags {' '.join(machine.get('cpu_flags', [])) or 'none of interest'}), "
        f"torch {machine.get('versions', {}).get('torch')}, "
        f"onnxruntime {machine.get('versions', {}).get('onnxruntime')}.",
    ]
    if peak_gflops:
        lines.append(f"Measured fp32 matmul peak: {peak_gflops:.1f} GFLOP/s.")
    for model in dict.fromkeys(c.model for c in cells):
        mine = sorted((c for c in cells if c.model == model), key=lambda c: (c.batch, c.median_ms))
        lines += [
            "",
            f"#### {model}",
            "",
            "| backend | batch | threads | median ms | p90 ms | p99 ms | samples/s | GFLOP/s | % of peak | × eager |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in mine:
            eager = next((e for e in mine if e.backend == "eager" and e.batch == c.batch), None)
            speedup = eager.median_ms / c.median_ms if eager else None
            pct = c.peak_fraction * 100 if c.peak_fraction is not None else None
            lines.append(
                f"| {c.backend} | {c.batch} | {c.threads} | {c.median_ms:.3f} | {c.p90_ms:.3f} "
                f"| {c.p99_ms:.3f} | {c.throughput:.1f} | {_fmt(c.gflops)} | {_fmt(pct, '.0f')} "
                f"| {_fmt(speedup, '.2f')} |"
            )
    return "\n".join(lines)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return Path(path)


def latency_chart(cells: list[Cell], path: Path) -> Path:
    """Median latency per backend, one panel per model, one bar group per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(c.model for c in cells))
    cols = min(3, max(1, len(models)))
    rows = -(-max(1, len(models)) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(models) :]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, models, strict=False):
        mine = [c for c in cells if c.model == model]
        backends = list(dict.fromkeys(c.backend for c in mine))
        batches = sorted({c.batch for c in mine})
        width = 0.8 / max(1, len(batches))
        for j, batch in enumerate(batches):
            values = [
                next((c.median_ms for c in mine if c.backend == b and c.batch == batch), 0.0)
                for b in backends
            ]
            ax.bar(
                [i + j * width for i in range(len(backends))], values, width, label=f"batch {batch}"
            )
        ax.set_xticks([i + width * (len(batches) - 1) / 2 for i in range(len(backends))])
        ax.set_xticklabels(backends, rotation=35, ha="right", fontsize=8)
        ax.set_title(model, fontsize=9)
        ax.set_ylabel("median latency (ms)")
        values = [c.median_ms for c in mine]
        if values and max(values) / max(min(values), 1e-9) > 20:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def throughput_chart(points: list[dict], path: Path) -> Path:
    """Served requests/s against concurrency: one line per backend and batching setting.

    A backend measured at one concurrency only (TorchServe's own port, measured
    at concurrency 1 for the gateway's cost) is left out: a single point is not a line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels: dict[tuple[str, str], set[int]] = {}
    for p in points:
        levels.setdefault((p["model"], p["backend"]), set()).add(p["concurrency"])
    points = [p for p in points if len(levels[p["model"], p["backend"]]) > 1]
    models = list(dict.fromkeys(p["model"] for p in points))
    fig, axes = plt.subplots(
        1, max(1, len(models)), figsize=(4.5 * max(1, len(models)), 3.6), squeeze=False
    )
    for ax, model in zip(axes[0], models, strict=False):
        mine = [p for p in points if p["model"] == model]
        for key in dict.fromkeys((p["backend"], p["batching"]) for p in mine):
            line = sorted(
                (p for p in mine if (p["backend"], p["batching"]) == key),
                key=lambda p: p["concurrency"],
            )
            ax.plot(
                [p["concurrency"] for p in line],
                [p["throughput"] for p in line],
                marker="o",
                label=f"{key[0]}, batching {key[1]}",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("requests/s")
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def _table(title: str, header: list[str], align: str, rows: list[list[str]]) -> str:
    """A titled Markdown table, or "" for no rows; `align` has one l or r per column."""
    if not rows:
        return ""
    clean = [[" ".join(str(cell).split()).replace("|", "/") for cell in row] for row in rows]
    lines = [f"#### {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in clean]
    return "\n".join(lines)


def served_markdown(served: list[dict]) -> str:
    return served_rows_markdown(
        "Served (TorchServe behind the gateway, and torchserve/<format>/direct: its own port; one "
        "single-threaded worker per core; .npy bodies; batching: off = batch 1, on = the "
        "archive defaults, old = batch 8 with 10 ms. kserve: the KServe runtime, one process, "
        "Open Inference Protocol binary bodies, batching on = up to 8 queued requests, no wait)",
        served,
    )


def served_rows_markdown(title: str, served: list[dict]) -> str:
    """Served points (bench.json's `served` or `peers` rows) as a titled table."""
    return _table(
        title,
        [
            "model",
            "backend",
            "batching",
            "concurrency",
            "requests",
            "failed",
            "median ms",
            "p90 ms",
            "p99 ms",
            "req/s",
            "server's split, ms per request",
        ],
        "lllrrrrrrrl",
        [
            [s["model"], s["backend"], s["batching"], s["concurrency"], s["requests"], s["failed"]]
            + [f"{s[k]:.2f}" for k in ("median_ms", "p90_ms", "p99_ms")]
            + [f"{s['throughput']:.1f}", _split_cell(s.get("server_ms"))]
            for s in served
        ],
    )


split_stages = ("decode", "queue", "compute", "encode", "backend")  # pipeline.bench.split.ORDER


def _split_cell(split: dict | None) -> str:
    """The server's own split of the row's mean (pipeline.bench.split); blank without one."""
    if not split:
        return ""
    stages = ", ".join(f"{k} {v:.3f}" for k, v in split.items() if k in split_stages)
    return f"{stages}; client+HTTP {split['client_and_http']:.3f}"


def targets_markdown(targets: list[dict]) -> str:
    return _table(
        "Targets",
        ["target", "reached", "detail", "met"],
        "lrll",
        [
            [t["target"], f"{t['value']:.2f}", t["detail"], "yes" if t["met"] else "no"]
            for t in targets
        ],
    )


def skipped_markdown(skipped: list[dict]) -> str:
    return _table(
        "Skipped",
        ["model", "batch", "backend", "why"],
        "lrll",
        [[s["model"], s["batch"], s["backend"], s["why"]] for s in skipped],
    )


def fastest_markdown(fastest: dict[str, dict[str, Any] | None]) -> str:
    return _table(
        "Fastest verified backend at batch 1 (fastest.json)",
        ["model", "backend", "format", "median ms"],
        "lllr",
        [
            [model, f["backend"], f["format"], f"{f['median_ms']:.3f}"]
            for model, f in fastest.items()
            if f
        ],
    )
