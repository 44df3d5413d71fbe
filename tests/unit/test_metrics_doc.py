"""docs/metrics.md lists every Prometheus metric the project's runtimes register, with the
kind, labels and help text the code gives it (issue 54: there was no metrics reference)."""

from __future__ import annotations

import re
from pathlib import Path

import prometheus_client

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(pipeline_[a-z0-9_]+)` \| (\w+) \| ([^|]+) \| ([^|]+) \|$", re.M)


def registered() -> dict[str, tuple[str, set[str], str]]:
    """name as scraped → (kind, labels, help) of every pipeline_* metric registered."""
    # Importing them registers them (the shadow check's, the workers' and the batcher's).
    import pipeline.runtimes.kserve.fastpath
    import pipeline.runtimes.kserve.models
    import pipeline.runtimes.kserve.runtime
    import pipeline.runtimes.kserve.shadow  # noqa: F401

    found = {}
    for collector in list(prometheus_client.REGISTRY._collector_to_names):
        name = getattr(collector, "_name", "")
        if not name.startswith("pipeline_"):
            continue
        kind = collector._type
        scraped = f"{name}_total" if kind == "counter" else name
        found[scraped] = (kind, set(collector._labelnames), collector._documentation)
    return found


def test_every_registered_metric_is_documented_as_the_code_defines_it() -> None:
    code = registered()
    assert "pipeline_shadow_checked_total" in code and "pipeline_kserve_compute_seconds" in code
    page = PAGE.read_text()
    rows = {m[0]: m[1:] for m in ROW.findall(page)}
    assert sorted(code) == sorted(rows), "docs/metrics.md lists other metrics than the code"
    for name, (kind, labels, doc) in code.items():
        page_kind, page_labels, page_doc = rows[name]
        assert page_kind == kind, name
        assert labels <= set(re.findall(r"`(\w+)`", page_labels)), (name, labels, page_labels)
        # The worker gauge's help and labels depend on whether its module was first imported
        # in multiprocess mode (several workers); the page gives both, the row and a note.
        assert page_doc.strip() == doc or f"{doc}." in page, (name, page_doc, doc)
