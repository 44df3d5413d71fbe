"""The precision Pareto table: per model and format, speed, size and what the model still
gets right, with the fastest formats *within the accuracy budget* marked.

Issue 29, point 3. Latency comes from this run's in-process cells (each format's own
backend, the bench's threads, batch 1 and 32); size and quality from the export's
manifest, as export measured them (pipeline/export/quality.py): for an int8 or float16
format, its task-level metric (accuracy drop in points, top-1 disagreement, or SQNR in
dB), the bound it was held to and whether it held; a float32 format is held to eager
elementwise instead, so its row says "elementwise" and its verify verdict. A row counts
as within the budget when this run's verify passed it (float32: elementwise; reduced:
task level, which is what `verified` means for it). The speed-up of each format is
against the fastest float32 format of the same model at the same batch, measured in the
same rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.bench.targets import cell
from pipeline.formats.base import FLOAT32

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel

BATCHES = (1, 32)


def _size(exported: ExportedModel, key: str, record: dict[str, Any]) -> int | None:
    size = record.get("size_bytes")
    if isinstance(size, int):
        return size
    try:
        return Path(exported.path(key)).stat().st_size
    except OSError:
        return None


def rows(model: str, exported: ExportedModel, cells: list[dict]) -> list[dict[str, Any]]:
    """One row per format the export holds; `fastest` lists the batches at which the row is
    the fastest within the budget."""
    out: list[dict[str, Any]] = []
    for fmt in exported.formats():
        record = exported.manifest.artifact(fmt.key) or {}
        quality = record.get("quality") if fmt.precision != FLOAT32 else None
        row: dict[str, Any] = {
            "model": model,
            "format": fmt.key,
            "precision": fmt.precision,
            "size_bytes": _size(exported, fmt.key, record),
            "metric": "elementwise (atol/rtol)" if quality is None else quality.get("metric"),
            "value": None if quality is None else quality.get("value"),
            "unit": "" if quality is None else quality.get("unit", ""),
            "bound": None if quality is None else quality.get("bound"),
            "agreement": None if quality is None else quality.get("agreement"),
            "sqnr_db": None if quality is None else quality.get("sqnr_db"),
            "fastest": [],
        }
        verified = []
        for batch in BATCHES:
            found = cell(cells, model, fmt.backend, batch)
            row[f"ms_{batch}"] = found["median_ms"] if found else None
            if found is not None:
                verified.append(bool(found.get("verified")))
        # Within the budget: this run's verify passed it (task level for int8/float16), and
        # the export's own check agreed (a reduced format written outside it says so).
        held = quality is None or quality.get("within_budget", False)
        row["within_budget"] = bool(verified) and all(verified) and bool(held)
        out.append(row)
    for batch in BATCHES:
        key = f"ms_{batch}"
        floats = [r[key] for r in out if r["precision"] == FLOAT32 and r[key] is not None]
        base = min(floats) if floats else None
        for r in out:
            r[f"speedup_{batch}"] = base / r[key] if base and r[key] else None
        within = [r for r in out if r["within_budget"] and r[key] is not None]
        if within:
            min(within, key=lambda r: r[key])["fastest"].append(batch)
    floats_size = [r["size_bytes"] for r in out if r["precision"] == FLOAT32 and r["size_bytes"]]
    for r in out:
        r["size_ratio"] = (
            r["size_bytes"] / max(floats_size) if floats_size and r["size_bytes"] else None
        )
    return out


def _num(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _quality(r: dict[str, Any]) -> str:
    if r["value"] is None:
        return r["metric"]
    text = f"{r['metric']}: {r['value']:.2f} {r['unit']}".rstrip()
    if r["bound"] is not None:
        text += f" (bound {r['bound']:g})"
    extra = []
    if r["agreement"] is not None:
        extra.append(f"agreement {r['agreement']:.1%}")
    if r["sqnr_db"] is not None and "sqnr" not in str(r["metric"]).lower():
        extra.append(f"SQNR {r['sqnr_db']:.1f} dB")
    return text + (f"; {', '.join(extra)}" if extra else "")


def markdown(table: list[dict[str, Any]]) -> str:
    """The table for bench.md; "" when no export holds a reduced-precision format."""
    if not any(r["precision"] != FLOAT32 for r in table):
        return ""
    head = (
        "#### Precision: speed, size and accuracy (★ fastest within the budget at that batch)\n\n"
        "Latency in-process, this run; speed-up against the model's fastest float32 format at "
        "the same batch; size and the task-level metric from the export's manifest.\n\n"
        "| model | format | precision | size MB | ÷ largest float32 | batch 1 ms | × | "
        "batch 32 ms | × | accuracy | within budget |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"
    )
    lines = [head]
    for r in table:
        marks = {b: " ★" if b in r["fastest"] else "" for b in BATCHES}
        size = None if r["size_bytes"] is None else r["size_bytes"] / 1e6
        lines.append(
            f"| {r['model']} | {r['format']} | {r['precision']} | {_num(size, '.2f')} | "
            f"{_num(r['size_ratio'], '.2f')} | {_num(r['ms_1'], '.3f')}{marks[1]} | "
            f"{_num(r['speedup_1'], '.2f')} | {_num(r['ms_32'], '.3f')}{marks[32]} | "
            f"{_num(r['speedup_32'], '.2f')} | {_quality(r)} | "
            f"{'yes' if r['within_budget'] else 'NO'} |"
        )
    return "\n".join(lines)


def chart(table: list[dict[str, Any]], path: Path) -> Path | None:
    """Batch-1 latency against size on disk, one panel per model, reduced formats outside
    the budget hollow; None when no export holds a reduced-precision format."""
    if not any(r["precision"] != FLOAT32 for r in table):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.bench.report import _save

    models = list(dict.fromkeys(r["model"] for r in table))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for r in (r for r in table if r["model"] == model):
            if r["ms_1"] is None or r["size_bytes"] is None:
                continue
            filled = r["within_budget"]
            ax.scatter(
                r["size_bytes"] / 1e6,
                r["ms_1"],
                s=60,
                facecolors="C0" if filled else "none",
                edgecolors="C0" if filled else "C3",
            )
            ax.annotate(
                r["format"],
                (r["size_bytes"] / 1e6, r["ms_1"]),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
        ax.set_title(f"{model}: batch 1 (hollow red: outside the budget)", fontsize=9)
        ax.set_xlabel("size on disk, MB")
        ax.set_ylabel("median latency, ms")
    return _save(fig, path)
