"""The report people look at: one Markdown page with the table, the localisation and,
per backend × output, a histogram of |error| against the tolerance (matplotlib PNG).

Markdown rather than HTML: it renders on GitHub and in the README, and the
images are plain files beside it (`<report>_files/`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.compare import HIST_DECADES, VACUOUS_FRACTION, Kind, json_number
from pipeline.verify.report import BOUND_HEADER, BOUND_LEGEND, ParityReport, Row


@dataclass
class Series:
    """One backend × output over every input set: the worst numbers and the summed histogram."""

    backend: str
    output: str
    rows: list[Row]

    @property
    def hist(self) -> list[int]:
        width = len(HIST_DECADES) + 1
        return [
            sum(r.comparison.hist[i] for r in self.rows if r.comparison.hist) for i in range(width)
        ]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def worst(self, attr: str) -> float:
        return max(getattr(r.comparison, attr) for r in self.rows)

    @property
    def deciding(self) -> Row:
        """The row whose bound cells speak for the series: a failure that never reached the
        bound, then one past it, then a vacuous one, then the least margin left, so a
        comfortable margin never stands for a series that failed."""

        def key(r: Row) -> tuple[bool, bool, bool, float]:
            used = r.comparison.bound_used or 0.0
            return (not r.measured, r.kind is Kind.TOLERANCE, r.comparison.vacuous, used)

        return max(self.rows, key=key)


def series(report: ParityReport) -> list[Series]:
    out: dict[tuple[str, str], Series] = {}
    for r in report.rows:
        out.setdefault((r.backend, r.output), Series(r.backend, r.output, [])).rows.append(r)
    return list(out.values())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def plot_histogram(s: Series, path: Path, atol: float) -> Path:
    """A bar per decade of |error| (plus exact zeros), with the atol line."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    counts = s.hist
    labels = ["0", f"<1e{HIST_DECADES[1]}"] + [f"1e{d}" for d in HIST_DECADES[1:-1]]
    labels.append(f"≥1e{HIST_DECADES[-1]}")
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    colours = ["#4c72b0"] * len(counts)
    for i, d in enumerate(HIST_DECADES, start=1):
        if 10.0 ** (d + 1) > atol:  # bins reaching past atol: failed unless rtol covered them
            colours[i] = "#c44e52"
    ax.bar(range(len(counts)), counts, color=colours)
    ax.set_xticks(range(len(counts)), labels, rotation=60, fontsize=7)
    ax.set_yscale("symlog")
    ax.set_ylabel("values")
    ax.set_xlabel("|backend − eager| (bin = decade starting at the label)")
    # Where atol and the reference's scale fall: a tolerance near the scale proves nothing.
    for value, name, style in ((atol, "atol", "--"), (s.worst("ref_max"), "max|ref|", ":")):
        if 0 < value < float("inf"):
            x = 0.5 + (math.log10(value) - HIST_DECADES[0])  # bars are centred on their decade
            x = min(max(x, 0.5), len(counts) - 0.5)
            ax.axvline(x, color="black", linestyle=style, linewidth=1)
            ax.text(x, ax.get_ylim()[1], f" {name} {value:.2g}", va="top", fontsize=8)
    verdict = "pass" if s.passed else "FAIL"
    ax.set_title(
        f"{s.backend} / {s.output}: {sum(counts)} values over {len(s.rows)} input sets — {verdict}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _n(x: float) -> str:
    return str(json_number(x)) if x == float("inf") else f"{x:.2e}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare | would end the Markdown cell


def _bound(r: Row) -> str:
    """The bound, decided-by and margin cells of `r`, joined as Markdown cells."""
    bound, term, margin = r.bound_cells()
    if r.kind is Kind.TOLERANCE:
        margin = f"**{margin}**"
    return " | ".join(_cell(x) for x in (bound, term, margin))


def write_page(report: ParityReport, path: Path) -> Path:
    """Write the Markdown report at `path` and its histograms beside it; returns `path`."""
    files = path.with_name(path.stem + "_files")
    verdict = "PASS" if report.passed else "FAIL"
    tol = report.tolerance
    lines = [
        f"# Parity report: {report.model} — {verdict}",
        "",
        f"{len(report.rows) - len(report.failures)} of {len(report.rows)} checks within "
        f"tolerance (atol {tol['atol']:g}, rtol {tol['rtol']:g}"
        + (f", atol scale {tol['atol_scale']:g}" if tol.get("atol_scale") else "")
        + f"); export `{report.export_dir}`, {report.created}.",
        "",
    ]
    if report.localisations:
        lines += ["## Where it diverges", ""]
        lines += [f"- {loc['line']}" for loc in report.localisations]
        lines.append("")
    if report.failures:
        lines += ["## Failures", ""]
        lines += [f"- {r.describe()}" for r in report.failures[:50]]
        lines.append("")
    if report.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    lines += [
        "## Per backend and output (worst over the input sets)",
        "",
        f"| backend | output | max abs | {_cell(BOUND_HEADER)} | decided by | margin | p99 abs "
        "| max\\|ref\\| | min atol | min rtol | top-1 | result |",
        "|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    charts = []
    for s in series(report):
        top1 = [r.comparison.top1 for r in s.rows if r.comparison.top1 is not None]
        kinds = sorted({str(r.kind) for r in s.rows if not r.passed})
        # Task-level and detection-rule rows have no element-wise statistics to show or plot.
        plain = any(r.statistics for r in s.rows)
        stats = [
            _n(s.worst(a)) if plain else "" for a in ("p99_abs", "ref_max", "min_atol", "min_rtol")
        ]
        lines.append(
            f"| {s.backend} | {s.output} | {_n(s.worst('max_abs'))} | {_bound(s.deciding)} "
            f"| {' | '.join(stats)} | {f'{min(top1):.0%}' if top1 else ''} "
            f"| {'pass' if s.passed else '**FAIL** ' + ', '.join(kinds)} |"
        )
        if not plain:
            continue  # int8/float16 at task level, detections by their rule: no |error| to plot
        png = files / f"hist-{_slug(s.backend)}-{_slug(s.output)}.png"
        plot_histogram(s, png, min(r.atol for r in s.rows))
        charts.append(f"![{s.backend} / {s.output}]({files.name}/{png.name})")
    lines += ["", "## |error| histograms", "", *charts, ""]
    lines += [
        "## Every check",
        "",
        f"| backend | inputs | output | max abs | {_cell(BOUND_HEADER)} | decided by | margin "
        "| p99 abs | max\\|ref\\| | ref std | min atol | min rtol | top-1 | result |",
        "|---|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in report.rows:
        c = r.comparison
        nums = (c.p99_abs, c.ref_max, c.ref_std, c.min_atol, c.min_rtol)
        lines.append(
            f"| {r.backend} | {r.inputs} | {r.output} | {_n(c.max_abs)} | {_bound(r)} | "
            + " | ".join(_n(x) if r.statistics else "" for x in nums)
            + f" | {'' if c.top1 is None else f'{c.top1:.0%}'} | "
            + ("pass" if r.passed else f"**{c.kind}**: {c.problem.replace('|', '/')}")
            + " |"
        )
    lines += [
        "",
        # In backticks: a paragraph that starts with | reads like a stray table row.
        "; ".join(BOUND_LEGEND).replace(BOUND_HEADER, f"`{BOUND_HEADER}`", 1)
        + ". In the first table: the input set nearest its bound.",
        "",
        "Rows judged at task level (int8, float16 formats) show their metric and bound in "
        "the bound column: the accuracy drop or top-1 disagreement in points against the "
        "accuracy budget, or SQNR in dB against the minimum SQNR.",
        "",
        "min atol / min rtol: the smallest tolerance that would have passed, the other held "
        "fixed. A check whose tolerance at the largest reference value is at least "
        f"{VACUOUS_FRACTION:g} of that value is *vacuous* (zeros would pass) and fails unless "
        "accepted (--allow-vacuous).",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
