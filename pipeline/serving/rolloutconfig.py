"""What `pipeline rollout` is asked to do (RolloutConfig) and the bounds a canary is held
to while it is watched (Bounds): the options, apart from the procedure (rollout.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.serving import live


@dataclass(frozen=True)
class Bounds:
    """What a canary may do before it is rolled back: judged once it has `min_requests`
    answers, on its error rate (5xx) and on its p99 against the default version's."""

    max_error_rate: float = 0.01
    max_p99_ratio: float = 3.0
    min_requests: int = 20

    def unjudged(self, canary: live.Tally) -> str | None:
        """Why the canary has not been judged yet (too few answers), or None."""
        if canary.requests >= self.min_requests:
            return None
        return (
            f"it answered {canary.requests} of the {self.min_requests} requests it is judged on "
            "(--min-requests)"
        )

    def breach(self, canary: live.Tally, default: live.Tally | None) -> str | None:
        if canary.requests < self.min_requests:
            return None
        if canary.error_rate() > self.max_error_rate:
            return (
                f"error rate {canary.error_rate():.1%} ({canary.failed} of {canary.requests}) "
                f"is over --max-error-rate {self.max_error_rate:.1%}"
            )
        mine, theirs = canary.p99_ms(), default.p99_ms() if default else None
        if mine is not None and theirs and mine > self.max_p99_ratio * theirs:
            return (
                f"p99 {mine:.2f} ms is over --max-p99-ratio {self.max_p99_ratio:g} × the "
                f"default version's {theirs:.2f} ms"
            )
        return None


@dataclass
class RolloutConfig:
    model: str
    run_dir: Path
    version: int | None = None  # None: with promote, the canary
    store: Path = paths.DEFAULT_STORE
    canary: float | None = None  # percent of unversioned requests
    promote: bool = False
    watch_s: float = 10.0
    bounds: Bounds = field(default_factory=Bounds)
    timeout_s: float = 180.0

    def validate(self) -> None:
        if self.promote and (self.canary is not None or self.version is not None):
            raise PipelineError("--promote takes no --version or --canary: it promotes the canary.")
        if not self.promote and self.version is None:
            raise PipelineError("Say which version: --version N (see `pipeline status`).")
        if self.canary is not None and not 0 < self.canary < 100:
            raise PipelineError(f"--canary is a percentage between 0 and 100, got {self.canary}.")
        if self.watch_s < 0 or self.bounds.min_requests < 0:
            raise PipelineError("--watch and --min-requests must be 0 or more.")


def judge(
    stats: dict[tuple[str, int], live.Tally],
    names: list[str],
    canary: int,
    default: int,
    bounds: Bounds,
) -> tuple[str | None, str, str | None]:
    """From the servers' tallies by (served name, version): (the first bound the canary
    breaks, or None; a one-line summary; why a served name's canary is not judged yet,
    or None)."""
    words = []
    unjudged = next(
        (
            f"{n} version {canary}: {why}"
            for n in names
            if (why := bounds.unjudged(stats.get((n, canary), live.Tally())))
        ),
        None,
    )
    for n in names:
        mine = stats.get((n, canary), live.Tally())
        theirs = stats.get((n, default))
        words.append(
            f"{n}: canary {mine.requests} answers, {mine.failed} failed, p99 "
            f"{mine.p99_ms() or 0:.2f} ms; default p99 {(theirs.p99_ms() if theirs else None) or 0:.2f} ms"
        )
        why = bounds.breach(mine, theirs)
        if why:
            return f"{n} version {canary}: {why}", "; ".join(words), unjudged
    return None, "; ".join(words), unjudged
