"""The code's shape: stages import only to their left, no import cycles, small modules.

The flow, left to right (docs/internals.md, "Layout"):
pipeline_runtime → core → zoo → formats → train → export → verify → serving → bench → runtimes
→ cli. A runtime package (pipeline/runtimes/<name>/) may use anything to its left; what is
to its left reaches it only through the runtime registry (pipeline.serving.runtime).
Every import counts, the ones inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [
    "pipeline_runtime",
    "pipeline.core",
    "pipeline.zoo",
    "pipeline.formats",
    "pipeline.train",
    "pipeline.export",
    "pipeline.verify",
    "pipeline.serving",
    "pipeline.bench",
    "pipeline.runtimes",
    "pipeline.cli",
]
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for package in ("pipeline", "pipeline_runtime"):
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int | None:
    best = None
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            best = i
    return best


def _imports(path: Path) -> set[str]:
    """Every pipeline/pipeline_runtime module `path` imports, anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pipeline.formats import cpp` imports the module pipeline.formats.cpp
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                for a in node.names
            ]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] in ("pipeline", "pipeline_runtime")}
    return out


GRAPH = {m: {i for i in _imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    loose = [m for m in MODULES if _layer(m) is None and m not in ("pipeline", "pipeline.__main__")]
    assert not loose, f"modules outside the layout: {loose}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_stage_imports_a_later_stage(module: str) -> None:
    mine = _layer(module)
    if mine is None:
        return  # the package itself and `python -m pipeline`
    later = [i for i in GRAPH[module] if (_layer(i) or 0) > mine]
    assert not later, f"{module} ({LAYERS[mine]}) imports later stages: {sorted(later)}"


def test_the_runtime_never_imports_the_pipeline() -> None:
    for module, imports in GRAPH.items():
        if module.startswith("pipeline_runtime"):
            assert not [i for i in imports if i.startswith("pipeline.") or i == "pipeline"], module


def test_no_import_cycles() -> None:
    # Package __init__ modules re-export their own submodules; an edge from a
    # submodule to its own package is an import of that package's public
    # names and would make every package a "cycle", so those edges are left out.
    def edges(module: str) -> set[str]:
        return {i for i in GRAPH[module] if not (i != module and module.startswith(i + "."))}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for nxt in sorted(edges(module)):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail(f"import cycle: {' → '.join(cycle)}")
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_are_small(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]} has {lines} lines (at most {MAX_LINES})"
