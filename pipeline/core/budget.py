"""The accuracy budget a reduced-precision format is held to, from export to serve.

Export records it in each int8/float16 artifact's manifest record; verify,
bench (through verify) and the choice of what to serve read it from there,
and `--accuracy-budget` / `--min-sqnr` override it. The rules it bounds are in
pipeline/export/quality.py; docs/verification.md says why the defaults are these.
Torch-free, so `pipeline --help` can print the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import PipelineError

DEFAULT_ACCURACY_BUDGET = 0.5  # points of accuracy (or of top-1 agreement)
# Per precision; docs/verification.md ("The SQNR floor") says why these numbers.
DEFAULT_MIN_SQNR_DB: dict[str, float] = {"int8": 20.0, "float16": 40.0}


@dataclass(frozen=True)
class Budget:
    """The bounds a reduced-precision format must meet (carried from export to serve)."""

    accuracy_points: float = DEFAULT_ACCURACY_BUDGET
    min_sqnr_db: float | None = None  # None: DEFAULT_MIN_SQNR_DB for the format's precision

    def validate(self) -> None:
        if not (math.isfinite(self.accuracy_points) and self.accuracy_points >= 0):
            raise PipelineError(
                f"--accuracy-budget must be a finite number of points, 0 or more, got "
                f"{self.accuracy_points} (e.g. --accuracy-budget 0.5)."
            )
        if self.min_sqnr_db is not None and not math.isfinite(self.min_sqnr_db):
            raise PipelineError(f"--min-sqnr must be a finite dB value, got {self.min_sqnr_db}.")

    def sqnr_for(self, precision: str) -> float:
        if self.min_sqnr_db is not None:
            return self.min_sqnr_db
        return DEFAULT_MIN_SQNR_DB.get(precision, DEFAULT_MIN_SQNR_DB["int8"])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accuracy_points": self.accuracy_points}
        if self.min_sqnr_db is not None:
            out["min_sqnr_db"] = self.min_sqnr_db
        return out

    @classmethod
    def from_json(cls, data: Any) -> Budget:
        if not isinstance(data, Mapping):
            return cls()
        sqnr = data.get("min_sqnr_db")
        return cls(
            float(data.get("accuracy_points", DEFAULT_ACCURACY_BUDGET)),
            None if sqnr is None else float(sqnr),
        )

    def override(self, accuracy_points: float | None, min_sqnr_db: float | None) -> Budget:
        """This budget with the values a command line gave (None: keep this one's)."""
        return Budget(
            self.accuracy_points if accuracy_points is None else accuracy_points,
            self.min_sqnr_db if min_sqnr_db is None else min_sqnr_db,
        )
