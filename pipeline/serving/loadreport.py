"""A load run's report (pipeline.serving.loadtest): what it counts, its summary lines,
its JSON and Markdown."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.fileio import write_json


@dataclass
class LoadReport:
    served: str  # the served name the requests went to
    requests: int
    concurrency: int
    answered: int = 0
    failed: int = 0  # answered with an error after every retry, or never answered
    server_errors: int = 0  # answers of 500 or more after the retries, warm-up included
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
    killed_node: str | None = None  # --kill-node-after: the worker node killed
    # From the node's kill until the first answer after the last request that failed
    # (after the kill): how long clients saw the model not answering.
    node_recovery_s: float | None = None
    failed_after_kill: int = 0  # requests that failed, retries spent, after the kill
    by_version: dict[str, int] = field(default_factory=dict)  # answers per version named
    checked_by_version: bool = False  # each answer held to its own version (--by-version)
    errors: list[str] = field(default_factory=list)  # the first few, for the report
    # An int8/float16 format's answers, pooled: the task-level verdicts (Verdict.to_json)
    # they were held to instead of eager's tolerance (pipeline.serving.loadjudge).
    judged: list[dict[str, Any]] = field(default_factory=list)
    judged_as: str = ""  # "<format> (<precision>)" when judged
    agreement: float | None = None  # top-1 agreement with eager, reported only

    @property
    def passed(self) -> bool:
        return not self.why_failed()

    def why_failed(self) -> list[str]:
        """What failed the run, each as the verdict line names it (none when it passed).
        A run the time limit ended fails too: fewer requests than asked were checked."""
        why = [
            f"{n} {what}"
            for n, what in (
                (self.failed, "request(s) failed"),
                (self.server_errors, "answer(s) of 500 or more"),
                (self.wrong, "answer(s) wrong"),
            )
            if n
        ]
        if self.not_sent:
            why.append(
                f"{self.not_sent} request(s) not sent: --time-limit ended the run first, and a "
                "run passes only when every one of its --requests was answered and right"
            )
        why += [f"{v['output']} outside its budget" for v in self.judged if not v["passed"]]
        return why

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def summary(self) -> str:
        sent = self.requests - self.not_sent
        asked = f"{sent} of {self.requests}" if self.not_sent else f"{self.requests}"
        lines = [
            f"{self.served}: {asked} requests at concurrency {self.concurrency} in "
            f"{self.duration_s:.1f} s ({self.throughput_rps:.0f} req/s)",
            f"  answered {self.answered}, failed {self.failed} ({self.server_errors} with a 5xx), "
            f"wrong {self.wrong}, not sent {self.not_sent}, retries {self.retried}",
            f"  latency p50 {self.p50_ms:.1f} ms, p90 {self.p90_ms:.1f} ms, p99 {self.p99_ms:.1f} ms",
            f"  worker RSS {self.worker_rss_mb_before:.0f} MiB after warm-up, "
            f"{self.worker_rss_mb_after:.0f} MiB at the end",
        ]
        if self.killed_pid is not None:
            recovery = f"{self.recovery_s:.1f} s" if self.recovery_s is not None else "never"
            lines.append(
                f"  worker {self.killed_pid} SIGKILLed; a new worker was READY in {recovery}"
            )
        if self.killed_node is not None:
            back = f"{self.node_recovery_s:.1f} s" if self.node_recovery_s is not None else "never"
            lines.append(
                f"  node {self.killed_node[:12]} killed: {self.failed_after_kill} request(s) "
                f"failed after it; answering again from the surviving nodes in {back}"
            )
        if len(self.by_version) > 1 or "None" not in self.by_version:
            answered = ", ".join(f"{v}: {n}" for v, n in sorted(self.by_version.items()))
            lines.append(f"  answers by version: {answered}")
        if self.wrong and len(self.by_version) > 1 and not self.checked_by_version:
            # A canary or a rollout under way: one export cannot judge two versions' answers.
            lines.append(
                "  several versions answered and each was held to one export: with a canary "
                "or a rollout under way, run with --by-version (each answer against its own "
                "version in --store)"
            )
        if self.not_sent:
            lines.append(
                f"  the time limit ended the run with {self.not_sent} request(s) not sent "
                "(--time-limit)"
            )
        lines += self._judged_lines()
        lines += [f"  error: {e}" for e in self.errors]
        lines.append("  PASSED" if self.passed else f"  FAILED: {'; '.join(self.why_failed())}")
        return "\n".join(lines)

    def _judged_lines(self) -> list[str]:
        if not self.judged_as:
            return []
        agreement = (
            f"; top-1 agreement with eager {self.agreement:.1%} (reported, not judged)"
            if self.agreement is not None
            else ""
        )
        lines = [
            f"  {self.judged_as}: answers held to the task-level SQNR export and verify "
            f"hold it to, not eager's tolerance{agreement}"
        ]
        for v in self.judged:
            lines.append(f"    {v['output']}: {'passed' if v['passed'] else 'FAILED'}: {v['said']}")
        if not self.judged:
            lines.append("    nothing answered to judge")
        return lines


def write_reports(reports: list[LoadReport], path: Path) -> None:
    write_json(path, {"runs": [r.to_json() for r in reports]})


def to_markdown(reports: list[LoadReport]) -> str:
    rows = [
        "| served | requests | concurrency | failed | not sent | 5xx | wrong | retries | req/s "
        "| p50 ms | p99 ms | worker RSS MiB (warm → end) | recovery after SIGKILL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in reports:
        recovery = (
            "—"
            if r.killed_pid is None
            else (f"{r.recovery_s:.1f} s" if r.recovery_s is not None else "never")
        )
        rows.append(
            f"| {r.served} | {r.requests} | {r.concurrency} | {r.failed} | {r.not_sent} "
            f"| {r.server_errors} | {r.wrong} "
            f"| {r.retried} | {r.throughput_rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {r.worker_rss_mb_before:.0f} → {r.worker_rss_mb_after:.0f} | {recovery} |"
        )
    return "\n".join(rows)
