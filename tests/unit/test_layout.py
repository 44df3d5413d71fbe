"""The code's shape: stages import only to their left, no import cycles, small modules.

The flow, left to right (docs/internals.md, "Layout"):
pipeline_runtime → core → zoo → formats → train → export → verify → serving → bench → runtimes
→ cli. A runtime package (pipeline/runtimes/<name>/) may use anything to its left; what is
to its left reaches it only through the runtime registry (pipeline.serving.runtime).
Every import counts, the ones inside functions too.
"""

from __future__ import annotations

import ast
import re
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


# A module is split by responsibility, not squeezed under MAX_LINES by hand-packed lines
# the formatter is told to leave alone (issue 50: there were 94).
MAX_FMT_SKIPS = 20


def test_modules_are_not_squeezed_to_fit() -> None:
    skips = {
        str(path): text.count("# fmt: skip")
        for path in MODULES.values()
        if "# fmt: skip" in (text := path.read_text(encoding="utf-8"))
    }
    offs = [str(p) for p in MODULES.values() if "# fmt: off" in p.read_text(encoding="utf-8")]
    assert sum(skips.values()) < MAX_FMT_SKIPS, skips
    assert not offs, offs


def _runtime_literals() -> tuple[str, ...]:
    from pipeline.serving import runtime

    return runtime.BUILTIN


def _pairs(target: ast.AST, value: ast.AST | None) -> list[tuple[ast.AST, ast.AST]]:
    """(target, value) of one assignment, unpacking `A, B = "kserve", "onnx"`."""
    if value is None:
        return []
    if (
        isinstance(target, ast.Tuple | ast.List)
        and isinstance(value, ast.Tuple | ast.List)
        and len(target.elts) == len(value.elts)
    ):
        return [p for t, v in zip(target.elts, value.elts, strict=True) for p in _pairs(t, v)]
    return [(target, value)]


def _assigned(tree: ast.AST, names: tuple[str, ...]) -> dict[str, set[str]]:
    """Names assigned a runtime's name, however (`KSERVE = "kserve"`, `A, B = "kserve",
    "onnx"`, `K: str = "kserve"`, `(k := "kserve")`, `self.k = "kserve"`) → the names."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        pairs: list[tuple[ast.AST, ast.AST]] = []
        if isinstance(node, ast.Assign):
            pairs = [p for t in node.targets for p in _pairs(t, node.value)]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
            pairs = _pairs(node.target, node.value)
        for target, value in pairs:
            if not (isinstance(value, ast.Constant) and value.value in names):
                continue
            if isinstance(target, ast.Name | ast.Attribute):
                alias = target.id if isinstance(target, ast.Name) else target.attr
                out.setdefault(alias, set()).add(value.value)
    return out


def _compared_runtime_names(path: Path, names: tuple[str, ...]) -> list[str]:
    """Comparisons in `path` with one of `names`: the literal (`== "kserve"`, `in
    ("torchserve", ...)`, a `case "kserve":`) or a constant assigned one (`KSERVE =
    "kserve"` ... `== wire.KSERVE`), in this file or, unambiguously, anywhere."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {k: v for k, v in ALIASES.items() if len(v) == 1} | _assigned(tree, RUNTIMES)

    def literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and node.value in names:
            return True
        if isinstance(node, ast.Name | ast.Attribute):
            alias = node.id if isinstance(node, ast.Name) else node.attr
            return bool(aliases.get(alias, set()) & set(names))
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(literal(e) for e in node.elts)
        return False

    def prefix(node: ast.AST) -> bool:
        # `.startswith("torchserve-direct/")`: a runtime's name as the start of a string
        # compared by prefix (its name, then a character no name continues with).
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(prefix(e) for e in node.elts)
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return literal(node)
        return any(
            node.value == n or (node.value.startswith(n) and not node.value[len(n)].isalnum())
            for n in names
        )

    found = []
    for node in ast.walk(tree):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            operands = [node.pattern.value]
        is_prefix = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "removeprefix")
            and any(prefix(a) for a in node.args)
        )
        if is_prefix or any(literal(o) for o in operands):
            where = getattr(node, "lineno", None) or node.pattern.lineno  # type: ignore[attr-defined]
            found.append(f"{path.name}:{where}: {ast.unparse(node).splitlines()[0]}")
    return found


RUNTIMES = _runtime_literals()
ALIASES: dict[str, set[str]] = {}
for _path in MODULES.values():
    for _alias, _names in _assigned(ast.parse(_path.read_text(encoding="utf-8")), RUNTIMES).items():
        ALIASES.setdefault(_alias, set()).update(_names)


def _runtime_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["pipeline", "runtimes"] and len(parts) > 2 else None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_a_runtime_compares_its_own_name(module: str) -> None:
    """Outside pipeline/runtimes/<name>/, code asks the runtime registry; it never branches
    on a runtime's name (docs/internals.md, "Adding a runtime")."""
    own = _runtime_package(module)
    others = tuple(n for n in RUNTIMES if n != own)
    found = _compared_runtime_names(MODULES[module], others)
    assert not found, "compares a runtime's name outside its package:\n" + "\n".join(found)


def test_the_runtime_name_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        'KSERVE = "kserve"\n'
        "def f(server, rt, wire):\n"
        '    if server.runtime == "kserve": pass\n'
        '    if rt in ("torchserve", "x"): pass\n'
        "    if server.runtime != wire.KSERVE: pass\n"
        "    if rt.name == rt.other: pass\n"
        "    match rt:\n"
        '        case "torchserve": pass\n'
        '    if rt.startswith("torchserve-direct/"): pass\n'
        '    if rt.startswith(("x", KSERVE)): pass\n'
        '    if rt.startswith("kservex"): pass\n'
        'TRACED, FORMAT = "kserve", "onnx"\n'
        'ANNOTATED: str = "torchserve"\n'
        "def g(rt, names):\n"
        "    if TRACED not in names: pass\n"
        "    if rt == ANNOTATED: pass\n"
        '    if (k := "kserve") and rt == k: pass\n'
        "    if rt == FORMAT: pass\n"
    )
    found = _compared_runtime_names(bad, RUNTIMES)
    lines = [f.split(":")[1] for f in found]
    assert lines == ["3", "4", "5", "8", "9", "10", "15", "16", "17"], found


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if _runtime_package(m) and m.count(".") > 2)
)
def test_no_runtime_module_imports_its_package_face(module: str) -> None:
    """A runtime's modules share names through a module of their own (constants.py), not
    through the package's face, which registers the runtime: importing it from inside
    makes every module depend on the whole registration (and hides import cycles, which
    test_no_import_cycles leaves out for a package's own face)."""
    face = ".".join(module.split(".")[:3])
    assert face not in GRAPH[module], f"{module} imports names from {face} (its package's face)"


# TorchServe's notions (issue 50): a served model is not an archive. Outside a runtime's
# package no name (variable, attribute, function, class, argument, keyword, import) says
# archive, mar, management or torchserve; strings may (messages, the registry's names).
TORCHSERVE_WORDS = re.compile(r"archive|(?:^|_)mars?(?:_|$)|management|torchserve", re.I)


def _torchserve_names(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name]
        else:
            continue
        line = getattr(node, "lineno", 0)
        found += [f"{path.name}:{line}: {n}" for n in names if TORCHSERVE_WORDS.search(n)]
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not _runtime_package(m)))
def test_shared_modules_use_runtime_neutral_names(module: str) -> None:
    found = _torchserve_names(MODULES[module])
    assert not found, "TorchServe's words in a shared module:\n" + "\n".join(found)


def test_the_torchserve_names_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from x import ArchiveInfo\n"
        "def archives_of(server, mar_path, *, management=None):\n"
        "    return server.archives, f(archive=1), TORCHSERVE_KEY\n"
        "marker = 'an archive, the management API, TorchServe'  # strings are free\n"
        "primary, summary = 1, 2  # words that merely contain the letters\n"
    )
    got = [f.split(": ")[1] for f in _torchserve_names(bad)]
    assert sorted(got) == sorted(
        ["ArchiveInfo", "archives_of", "mar_path", "management", "archives", "archive",
         "TORCHSERVE_KEY"]
    )  # fmt: skip
