"""The parity report: rows of (backend, input set, output) → a Comparison vs tolerance."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipeline.core.compare import Comparison, Kind, json_number
from pipeline.core.errors import ParityError
from pipeline.core.verdict import Verdict

DETECTIONS = "detections"  # the output name of a detection rule's row (verify/check.py)


def _said(err: BaseException) -> str:
    """What an exception says, in one line: a gRPC error's status and details (its text
    opens with "<_InactiveRpcError of RPC that terminated with:" and nothing more on the
    line), else the first line of its message."""
    code, details = getattr(err, "code", None), getattr(err, "details", None)
    if callable(code) and callable(details):
        try:
            return f"{code()}: {details()}"[:200]
        except Exception:  # noqa: BLE001 - not a gRPC error after all: its message then
            pass
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else ""


@dataclass(frozen=True)
class Row:
    backend: str
    inputs: str
    output: str
    atol: float
    rtol: float
    comparison: Comparison
    # A task-level check (reduced-precision formats, pipeline/verify/task.py): its metric
    # and bound replace atol/rtol in the table.
    task: Verdict | None = None

    @classmethod
    def of(
        cls, backend: str, inputs: str, output: str, c: Comparison, atol: float, rtol: float
    ) -> Row:
        return cls(backend, inputs, output, atol, rtol, c)

    @classmethod
    def crashed(
        cls, backend: str, inputs: str, output: str, err: BaseException, atol: float, rtol: float
    ) -> Row:
        problem = f"raised {type(err).__name__}: {_said(err)}"
        return cls(backend, inputs, output, atol, rtol, Comparison.failed(Kind.CRASHED, problem))

    @classmethod
    def missing(cls, backend: str, inputs: str, output: str, atol: float, rtol: float) -> Row:
        problem = "the backend did not return this output"
        return cls(backend, inputs, output, atol, rtol, Comparison.failed(Kind.MISSING, problem))

    @property
    def passed(self) -> bool:
        return self.comparison.passed

    @property
    def kind(self) -> Kind:
        return self.comparison.kind

    @property
    def problem(self) -> str:
        return self.comparison.problem

    @property
    def max_abs(self) -> float:
        return self.comparison.max_abs

    @property
    def max_rel(self) -> float:
        return self.comparison.max_rel

    @property
    def where(self) -> str:
        return f"{self.backend} / {self.inputs} / {self.output}"

    def describe(self) -> str:
        if self.task is not None:
            return f"{self.where}: {self.task.describe()}"
        c = self.comparison
        what = c.problem or f"max abs err {c.max_abs:.3g}, max rel err {c.max_rel:.3g}"
        kind = "" if c.passed or c.kind is Kind.TOLERANCE else f" [{c.kind}]"
        if c.kind in (Kind.CRASHED, Kind.MISSING):  # nothing was held to a tolerance
            return f"{self.where}: {what}{kind}"
        return f"{self.where}: {what} (atol {self.atol:g}, rtol {self.rtol:g}){kind}"

    def error(self) -> ParityError | None:
        return self.comparison.error(self.where)

    @property
    def statistics(self) -> bool:
        """Whether the row has element-wise |error| statistics (percentile, max|ref|, the
        smallest passing tolerances, a histogram): not a task-level verdict, and not the
        detection rule's row, whose two numbers are the worst box and score errors."""
        return self.task is None and self.output != DETECTIONS

    @property
    def measured(self) -> bool:
        """Whether the values were held against the tolerance (not crashed, missing,
        mis-shaped or non-finite: those fail before any bound is reached)."""
        return self.kind in (Kind.PASS, Kind.TOLERANCE, Kind.VACUOUS)

    @property
    def term(self) -> str | None:
        """The larger term of the allowance at the deciding element: "atol" or "rtol"."""
        c = self.comparison
        if self.task is not None:
            return None
        if not self.measured or c.bound_ref is None or c.max_abs == 0 or not c.bound_allowed:
            return None  # nothing measured, nothing to decide (exact), or no allowance at all
        return "atol" if self.atol >= self.rtol * c.bound_ref else "rtol"

    def bound_cells(self) -> tuple[str, str, str]:
        """(bound, decided by, margin): allclose's |err| <= atol + rtol·|ref| written out at
        the element that used the largest fraction of its allowance, the term that
        dominated there, and the room left ("94% left") or the excess ("3.2× over")."""
        c = self.comparison
        if not self.measured:
            return "—", "—", "—"
        if self.task is not None:
            return self.task.bound_text(), self.task.decided_by, self.task.margin_text()
        if self.output == DETECTIONS:
            return self._detection_cells()
        over = self.kind is Kind.TOLERANCE
        # A vacuous tolerance (accepted or not) passes zeros too: its room is no margin.
        vacuous = "vacuous" if c.vacuous and not over else ""
        if c.max_abs == 0:
            return "|err| = 0 everywhere", "—", vacuous or "exact"
        if c.bound_used is None or c.bound_err is None or c.bound_ref is None:
            return "", "", vacuous  # compared without detail: no element was singled out
        allowed = self.atol + self.rtol * c.bound_ref
        bound = (
            f"{c.bound_err:.1e} {'>' if over else '≤'} {_short(self.atol)} + "
            f"{_short(self.rtol)}·{c.bound_ref:.1e} = {allowed:.1e}"
        )
        term = {"atol": "atol", "rtol": "rtol·|ref|"}.get(self.term or "", "—")
        return bound, term, vacuous or _margin(c.bound_used, over)

    def _detection_cells(self) -> tuple[str, str, str]:
        """The detection rule's worst box and score errors against their bounds; its other
        failures (an unmatched detection) are in the row's problem, not a margin."""
        from pipeline.core import detections as detect

        c = self.comparison
        bound = (
            f"box {c.max_abs:.1e} ≤ {detect.BOX_ATOL:g} px, score {c.max_rel:.1e} ≤ "
            f"{detect.SCORE_ATOL:g}"
        )
        if self.kind is not Kind.PASS:
            margin = "vacuous" if self.kind is Kind.VACUOUS else "—"
        elif c.max_abs == 0 and c.max_rel == 0:
            margin = "exact"
        else:
            margin = _margin(max(c.max_abs / detect.BOX_ATOL, c.max_rel / detect.SCORE_ATOL), False)
        return bound, "detection rule", margin

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "inputs": self.inputs,
            "output": self.output,
            "atol": self.atol,
            "rtol": self.rtol,
            **self.comparison.to_json(),
            "bound_term": self.term,
            **({"task": self.task.to_json()} if self.task is not None else {}),
        }


BOUND_HEADER = "|err| ≤ atol + rtol·|ref|"
# Two lines: the terminal prints one a line, the page one paragraph.
BOUND_LEGEND = (
    f"{BOUND_HEADER}: allclose's rule, at the element that used the largest share of its "
    "allowance; decided by: the larger of the two terms there",
    "margin: the share of that allowance left, or how many times over it the error is; "
    "vacuous: zeros would pass too, so there is no margin to speak of",
)

TASK_LEGEND = (
    "int8/float16 formats are judged at task level against float32 eager: the accuracy drop "
    "on the validation split, or top-1 disagreement, in points (bound: the accuracy budget), "
    "or SQNR in dB (bound: the minimum SQNR); top-1: agreement with eager"
)

GOLDEN_FILE_BACKEND = "golden file"  # the outputs export stored, checked against today's eager
# Said when that check fails: every backend is compared with today's eager, so a model
# edited since export fails everywhere, and the golden file's row is what tells why.
# Said instead when the golden row is not finite: the model itself answers NaN or Inf.
NOT_FINITE = (
    "  note: eager PyTorch itself answers NaN or Inf on these inputs, so no backend can be "
    "judged on them: export again with inputs the model is defined on (a range: --input "
    "NAME:DTYPE:SHAPE:LOW:HIGH), or make the model finite there."
)
GOLDEN_CHANGED = (
    "  note: eager PyTorch no longer gives the outputs export stored in golden.pt: most "
    "likely the model's code (its file or module) changed since the export; its checkpoint "
    "is sha256-checked. Every backend above is compared with today's eager: if you meant "
    "to change the model, run `pipeline export` again."
)

# The order in which failure kinds are raised when a report holds several:
# a backend that cannot answer hides whatever its numbers would have said.
_SEVERITY = (Kind.CRASHED, Kind.MISSING, Kind.SHAPE, Kind.NON_FINITE, Kind.TOLERANCE, Kind.VACUOUS)


@dataclass
class ParityReport:
    model: str
    export_dir: str
    created: str
    tolerance: dict[str, Any]
    artifacts: dict[str, Any]
    rows: list[Row]
    # Per failing backend: where it first departs from eager (Localisation.to_json()).
    localisations: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # warnings that do not fail a check
    path: Path | None = field(default=None)
    page: Path | None = field(default=None)  # the human report (Markdown + histograms)
    # A store version's signature state and signer (pipeline/serving/signing.py State).
    signature: dict[str, Any] | None = None

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not self.failures

    def errors(self) -> list[ParityError]:
        """One typed exception per failing check."""
        return [e for r in self.rows if (e := r.error()) is not None]

    def raise_for_failures(self) -> None:
        """Raise the most severe failure's typed error (its `.errors` holds every one)."""
        if self.passed:
            return
        if not self.rows:
            raise ParityError(f"Parity for {self.model}: no check ran.")
        worst = min(self.failures, key=lambda r: _SEVERITY.index(r.kind))
        err = worst.kind.error(self.failure_message())
        err.errors = self.errors()  # type: ignore[attr-defined]
        err.report = self  # type: ignore[attr-defined]
        raise err

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "export_dir": self.export_dir,
            "created": self.created,
            "tolerance": self.tolerance,
            "artifacts": self.artifacts,
            "passed": self.passed,
            "checks": len(self.rows),
            "failures": [r.describe() for r in self.failures],
            "failure_kinds": sorted({str(r.kind) for r in self.failures}),
            "localisation": self.localisations,
            "notes": self.notes,
            "page": str(self.page) if self.page else None,
            **({"signature": self.signature} if self.signature is not None else {}),
            "rows": [r.to_json() for r in self.rows],
        }

    def failure_message(self) -> str:
        lines = [
            f"Parity FAILED for {self.model}: {len(self.failures)} of {len(self.rows)} checks "
            f"failed ({', '.join(sorted({str(r.kind) for r in self.failures}))}):"
        ]
        lines += [f"  - {r.describe()}" for r in self.failures]
        lines += [f"  where: {loc['line']}" for loc in self.localisations]
        # Not for a vacuous golden row (tied detections differ from run to run by
        # themselves), nor a non-finite one: eager's own NaN, not an edited model.
        golden = {r.kind for r in self.failures if r.backend == GOLDEN_FILE_BACKEND}
        if golden - {Kind.VACUOUS, Kind.NON_FINITE}:
            lines.append(GOLDEN_CHANGED)
        elif Kind.NON_FINITE in golden:
            lines.append(NOT_FINITE)
        if self.page:
            lines.append(f"Report: {self.page}")
        elif self.path:
            lines.append(f"Full report: {self.path}")
        return "\n".join(lines)

    def print_table(self, console: Console | None = None) -> None:
        if console is None:
            console = Console()
            if not console.is_terminal:  # pipes and CI logs: wide enough for one line a row
                console = Console(width=200)
        table = Table(title=f"Parity vs eager PyTorch — {self.model}", title_justify="left")
        columns = [
            ("backend", "left"),
            ("inputs", "left"),
            ("output", "left"),
            ("max abs", "right"),
            # Not max rel: above rtol it looks like a failure when atol decided a pass.
            (BOUND_HEADER, "right"),
            ("decided by", "left"),
            ("margin", "right"),
            ("p99 abs", "right"),
            ("max|ref|", "right"),
            ("min atol", "right"),
            ("min rtol", "right"),
            ("top-1", "right"),
            ("result", "left"),
        ]
        for col, justify in columns:
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in self.rows:
            c = r.comparison
            nums = (c.p99_abs, c.ref_max, c.min_atol, c.min_rtol)
            result = "[green]✓ pass[/]" if r.passed else f"[bold red]✗ {c.kind}[/]"
            tail = [_fmt(x) for x in nums] if r.statistics else ["", "", "", ""]
            bound, term, margin = r.bound_cells()
            style = "red" if r.kind is Kind.TOLERANCE else "yellow" if c.vacuous else "green"
            table.add_row(
                r.backend,
                r.inputs,
                r.output,
                _fmt(c.max_abs),
                bound,
                term,
                f"[{style}]{margin}[/]" if r.measured else margin,
                *tail,
                "" if c.top1 is None else f"{c.top1:.0%}",
                result,
            )
        console.print(table)
        tol = self.tolerance
        if self.rows and all(r.output == DETECTIONS for r in self.rows):
            # The detection rule's own bounds judged every row (its note says them).
            console.print("  tolerance: the detection rule's, in the notes below")
        else:
            console.print(
                f"  tolerance: atol {tol['atol']:g}, rtol {tol['rtol']:g}"
                + (f", atol scale {tol['atol_scale']:g}" if tol.get("atol_scale") else "")
                + "; min atol / min rtol: the smallest that would have passed, the other held "
                "fixed"
            )
        for line in BOUND_LEGEND:
            console.print(f"  {line}")
        if any(r.task is not None for r in self.rows):
            console.print(f"  {TASK_LEGEND}")
        for name, art in self.artifacts.items():
            how = art.get("method") or art.get("exporter") or ""
            console.print(f"  {name}: {art.get('file')}  {how}  {art.get('reason', '')}".rstrip())
        for note in self.notes:
            console.print(f"  [yellow]note:[/] {note}")
        for loc in self.localisations:
            console.print(f"  [bold]where:[/] {loc['line']}")
        verdict = "[green]PASS[/]" if self.passed else "[bold red]FAIL[/]"
        console.print(
            f"{verdict}: {len(self.rows) - len(self.failures)}/{len(self.rows)} checks within tolerance"
            + (f"; report written to {self.path}" if self.path else "")
        )
        if self.page:
            console.print(f"  report with histograms: {self.page}")


def _fmt(x: float) -> str:
    return str(json_number(x)) if x == float("inf") else f"{x:.1e}"


def _short(x: float) -> str:
    # Tolerances are mostly powers of ten: 1e-05 reads faster than 1.0e-05.
    return "0" if x == 0 else f"{x:.1e}".replace(".0e", "e")


def _margin(used: float, over: bool) -> str:
    """The used fraction of the allowance as a reader wants it: room left, or times over."""
    if over:
        if math.isinf(used):
            return "∞× over"  # an error where atol + rtol·|ref| is 0
        if used < 10:
            return f"{used:.1f}× over"
        return f"{used:.0f}× over" if used < 1000 else f"{used:.1e}× over"
    left = 1.0 - used
    if 0 < left < 0.01:
        return "<1% left"
    # Rounded down: "100% left" only for no error at all.
    return f"{math.floor(left * 100)}% left"
