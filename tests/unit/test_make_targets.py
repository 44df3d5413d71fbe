"""The Makefile's model lists say what the README says they hold."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.zoo import zoo_names

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def _list(name: str) -> list[str]:
    found = re.search(rf"^{name} \?= (.+)$", MAKEFILE.read_text(), re.M)
    assert found, f"the Makefile has no {name}"
    return found[1].split()


def test_make_demo_runs_every_built_in_model() -> None:
    # README: "make demo ... all 8 built-in models"; `make serve` serves the same list.
    assert sorted(_list("DEMO_MODELS")) == sorted(zoo_names())
    assert f"all {len(zoo_names())} built-in models" in (MAKEFILE.parent / "README.md").read_text()
