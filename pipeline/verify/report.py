"""The parity report: rows of (backend, input, output) → error vs tolerance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipeline.core.compare import Comparison


@dataclass(frozen=True)
class Row:
    backend: str
    inputs: str
    output: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool
    problem: str = ""

    @classmethod
    def of(
        cls, backend: str, inputs: str, output: str, c: Comparison, atol: float, rtol: float
    ) -> Row:
        return cls(backend, inputs, output, c.max_abs, c.max_rel, atol, rtol, c.passed, c.problem)

    @classmethod
    def crashed(
        cls, backend: str, inputs: str, output: str, err: BaseException, atol: float, rtol: float
    ) -> Row:
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return cls(
            backend,
            inputs,
            output,
            float("inf"),
            float("inf"),
            atol,
            rtol,
            False,
            f"raised {type(err).__name__}: {text}",
        )

    def describe(self) -> str:
        what = self.problem or f"max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g}"
        return f"{self.backend} / {self.inputs} / {self.output}: {what} (atol {self.atol:g}, rtol {self.rtol:g})"

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | str:
            return x if x != float("inf") else "inf"

        return {
            "backend": self.backend,
            "inputs": self.inputs,
            "output": self.output,
            "max_abs": num(self.max_abs),
            "max_rel": num(self.max_rel),
            "atol": self.atol,
            "rtol": self.rtol,
            "passed": self.passed,
            "problem": self.problem,
        }


@dataclass
class ParityReport:
    model: str
    export_dir: str
    created: str
    tolerance: dict[str, float]
    artifacts: dict[str, Any]
    rows: list[Row]
    path: Path | None = field(default=None)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not self.failures

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
            "rows": [r.to_json() for r in self.rows],
        }

    def failure_message(self) -> str:
        lines = [
            f"Parity FAILED for {self.model}: {len(self.failures)} of {len(self.rows)} checks out of tolerance:"
        ]
        lines += [f"  - {r.describe()}" for r in self.failures]
        if self.path:
            lines.append(f"Full report: {self.path}")
        return "\n".join(lines)

    def print_table(self, console: Console | None = None) -> None:
        if console is None:
            console = Console()
            if not console.is_terminal:  # pipes and CI logs: wide enough for one line a row
                console = Console(width=150)
        table = Table(title=f"Parity vs eager PyTorch — {self.model}", title_justify="left")
        for col, justify in [
            ("backend", "left"),
            ("inputs", "left"),
            ("output", "left"),
            ("max abs err", "right"),
            ("max rel err", "right"),
            ("atol", "right"),
            ("rtol", "right"),
            ("result", "center"),
        ]:
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in self.rows:
            result = "[green]✓ pass[/]" if r.passed else f"[bold red]✗ FAIL[/] {r.problem}"
            table.add_row(
                r.backend,
                r.inputs,
                r.output,
                f"{r.max_abs:.2e}",
                f"{r.max_rel:.2e}",
                f"{r.atol:g}",
                f"{r.rtol:g}",
                result,
            )
        console.print(table)
        for name, art in self.artifacts.items():
            how = art.get("method") or art.get("exporter") or ""
            console.print(f"  {name}: {art.get('file')}  {how}  {art.get('reason', '')}".rstrip())
        verdict = "[green]PASS[/]" if self.passed else "[bold red]FAIL[/]"
        console.print(
            f"{verdict}: {len(self.rows) - len(self.failures)}/{len(self.rows)} checks within tolerance"
            + (f"; report written to {self.path}" if self.path else "")
        )
