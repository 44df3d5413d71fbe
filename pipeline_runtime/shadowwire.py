"""What crosses the queues between a worker and its shadow-check reference process
(issue 41): the samples it hands over, the verdicts that come back, and the first
message, READY. Both runtimes' workers build samples (the KServe runtime's and
TorchServe's handler, which has only pipeline_runtime), and the reference
(pipeline.serving.shadowref) reads them, so the types live in this lowest layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

READY = "ready"  # the first message on the verdicts queue: the references are loaded


@dataclass
class Sample:
    """One answered request, as the worker hands it over."""

    model: str  # the served name
    version: int
    format: str
    export_dir: str
    inputs: dict[str, np.ndarray]  # with their batch axis, as the model ran them
    outputs: list[np.ndarray]  # in the manifest's order, as answered
    request_id: str = ""
    trace_id: str = ""


@dataclass
class Verdict:
    model: str
    version: int
    format: str
    diverged: bool
    share: float  # the error's share of its allowance (<= 1 agrees)
    what: str = ""  # for a divergent one: what differed
    kept: str = ""  # where it was kept ("" when not)
    error: str = ""  # the check itself failed (no reference): counted apart
    extra: dict[str, Any] = field(default_factory=dict)
