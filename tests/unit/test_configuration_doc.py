"""docs/configuration.md names every environment variable the code reads or sets, so a new
one cannot ship undocumented (issue 54: the variables were scattered over five pages)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
SOURCES = ("pipeline", "pipeline_runtime", "tests/jit_refused")
# A variable: read through os.environ / getenv, put in an environment, or named by a
# module constant; the prefixes are the project's and the libraries' it configures.
READ = re.compile(
    r"""(?:environ(?:\.get)?\(|environ\[|getenv\(|setdefault\(|\benv\.get\(|\benv\[)"""
    r"""\s*["']([A-Z][A-Z0-9_]{2,})["']"""
)
# A key of an environment dict given to a process ({"TMPDIR": ..., "OMP_NUM_THREADS": ...}):
# the prefixes of the variables a runtime hands its processes (a user's trial found
# TorchServe's LOG_LOCATION and the runtimes' OMP_NUM_THREADS unlisted; READ missed them).
SET = re.compile(
    r"""["']((?:OMP|MKL|TMPDIR|LOG_LOCATION|METRICS_LOCATION|PYTHON)[A-Z0-9_]*)["']\s*:"""
)
NAMED = re.compile(
    r"""["']((?:PIPELINE|OTEL|RAY|GW|AOTI|CUBLAS|KINETO|PROMETHEUS|JIT|CUDA|TORCH|RANK|WORLD|LOCAL)"""
    r"""(?:_[A-Z0-9]+)*)["']"""
)
# Strings of those shapes that are not variables (a CUDA version constant, for one) would
# go here, each with why; none today.
NOT_VARIABLES: set[str] = set()


def variables() -> set[str]:
    found: set[str] = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            found |= set(READ.findall(text)) | set(NAMED.findall(text)) | set(SET.findall(text))
    return found - NOT_VARIABLES


def test_every_variable_the_code_uses_is_documented() -> None:
    found = variables()
    assert {
        "PIPELINE_TRUST",
        "PIPELINE_MAX_SAMPLES",
        "OTEL_SERVICE_NAME",
        "JAVA_HOME",  # env.get
        "LOG_LOCATION",  # an environment dict's key
    } <= found  # the scan works
    page = PAGE.read_text()
    missing = sorted(v for v in found if f"`{v}`" not in page)
    assert not missing, f"docs/configuration.md does not name: {', '.join(missing)}"
