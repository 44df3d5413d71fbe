"""The README and docs/ say only what works.

Every ```bash block in README.md, docs/ and cpp_client/README.md carries a marker on
the line before it: `<!-- test: walkthrough -->` (README only: `test_walkthrough` runs
those blocks, in order, as written, in a copy of the repository) or `<!-- not run by
tests: REASON -->`; docs/own-model.md's are `<!-- test: own-model -->`, run by
`test_own_model`. Every block, run or not, is checked: each `make` target it names
exists and each `pipeline` option it uses is in that stage's `--help`.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "cpp_client/README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
WALKTHROUGH = "<!-- test: walkthrough -->"
# docs/own-model.md's blocks, run in order by tests/e2e/test_own_model.py.
OWN_MODEL = "<!-- test: own-model -->"
OWN_MODEL_PAGE = ROOT / "docs" / "own-model.md"
# docs/tracing.md's example, run against the tests' OTLP receiver by tests/e2e/test_doc_tracing.py.
TRACING = "<!-- test: tracing -->"
TRACING_PAGE = ROOT / "docs" / "tracing.md"
# docs/kserve.md's first example, run by tests/integration/test_kserve_page.py.
KSERVE = "<!-- test: kserve -->"
KSERVE_PAGE = ROOT / "docs" / "kserve.md"
# The markers that one page's examples carry, and that page.
PAGE_RUNS = {OWN_MODEL: OWN_MODEL_PAGE, TRACING: TRACING_PAGE, KSERVE: KSERVE_PAGE}
NOT_RUN = re.compile(r"^<!-- not run by tests: \S.*\S -->$")
SHELLS = {"sh", "shell", "console", "zsh", "bash"}
# Options of `pipeline` itself, before the stage name.
GLOBAL = {"--artifacts-dir": 1, "-v": 0, "--verbose": 0}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str
    marker: str  # the line before the fence

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rpartition("\n")[2].strip()
            line = text.count("\n", 0, m.start()) + 1
            out.append(Block(page, line, m[1], m[2], before))
    return out


def page_folder(folder: Path, export_dir: Path, model: str = "digits_lenet") -> Path:
    """`folder` set up as a page's commands expect their working folder: the project's
    `.venv` linked in, and `export_dir` where `artifacts/<model>/export` would be."""
    (folder / ".venv").symlink_to(ROOT / ".venv")
    (folder / "artifacts" / model).mkdir(parents=True)
    (folder / "artifacts" / model / "export").symlink_to(export_dir)
    return folder


def commands(block: Block) -> list[str]:
    """The block's command lines: continuation lines joined, comment-only and blank lines
    dropped (bash reads a trailing comment itself)."""
    text = block.text.replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _pieces(command: str) -> list[list[str]]:
    """One command line as the programs it runs (split at &&, ||, ;, | and &), each as
    its words, comments dropped, quotes honoured as bash does."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            out.append([])
        else:
            out[-1].append(token)
    return [words for words in out if words]


def all_commands() -> list[list[str]]:
    """Every program every ```bash block runs, as its words."""
    found = [
        piece for b in blocks() if b.lang == "bash" for c in commands(b) for piece in _pieces(c)
    ]
    assert len(found) > 50, "the pages' commands were not found"  # the parsing itself works
    return found


def test_every_command_block_is_bash_and_marked() -> None:
    problems = []
    for b in blocks():
        if b.lang in SHELLS - {"bash"}:
            problems.append(f"{b.where}: ```{b.lang}: commands are ```bash, output ```text")
        if b.lang != "bash":
            continue
        if b.marker == WALKTHROUGH:
            if b.page.name != "README.md" or b.page.parent != ROOT:
                problems.append(f"{b.where}: only README's example is the walkthrough")
        elif b.marker in PAGE_RUNS:
            if b.page != PAGE_RUNS[b.marker]:
                page = PAGE_RUNS[b.marker].relative_to(ROOT)
                problems.append(f"{b.where}: only {page}'s example is {b.marker}")
        elif not NOT_RUN.match(b.marker):
            marks = ", ".join(f"`{m}`" for m in (WALKTHROUGH, *PAGE_RUNS))
            problems.append(f"{b.where}: no {marks} or `<!-- not run by tests: why -->`")
    assert not problems, "\n".join(problems)


def test_readme_has_the_two_entry_commands_and_fits_on_a_few_screens() -> None:
    readme = [
        words
        for b in blocks()
        if b.page == ROOT / "README.md" and b.lang == "bash"
        for c in commands(b)
        for words in _pieces(c)
    ]
    assert ["make", "demo"] in readme and ["make", "test"] in readme
    assert len((ROOT / "README.md").read_bytes()) < 12 * 1024


def test_every_make_target_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    missing = []
    for words in all_commands():
        if words[0] == "make":
            targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
            missing += [t for t in targets if not re.search(rf"^{re.escape(t)}:", makefile, re.M)]
    assert not missing, missing


@cache
def _help(*path: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", *path, "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"`pipeline {' '.join(path)} --help`: {proc.stderr}"
    return proc.stdout


def _stage_and_options(words: list[str]) -> tuple[list[str], list[str]] | None:
    """(stage path, options) of a `pipeline` command; None for another program."""
    if not words or Path(words[0]).name != "pipeline":
        return None
    args = words[1:]
    while args and args[0] in GLOBAL:
        args = args[1 + GLOBAL[args[0]] :]
    if not args:
        return [], []
    path = [args[0]]
    rest = [a for a in args[1:] if not a.startswith("-")]
    # A stage with sub-commands (`pipeline deploy kserve`) lists them under its positional
    # argument, indented by four spaces (argparse's layout).
    if rest and re.search(rf"^ {{4}}{re.escape(rest[0])}\s", _help(*path), flags=re.M):
        path.append(rest[0])
    return path, [a.split("=")[0] for a in args if a.startswith("--")]


def test_every_pipeline_option_exists() -> None:
    missing = []
    for piece in all_commands():
        found = _stage_and_options(piece)
        if found is None:
            continue
        path, options = found
        text = _help(*path)
        missing += [f"pipeline {' '.join(path)} {o}" for o in options if o not in text]
    assert not missing, missing


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text(encoding="utf-8")))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# Tables of measured figures. A table is one when its header names a unit, or one of its
# cells starts with a figure in a unit ("2.2 GiB", "0.87 / 1.58 / 1.53 ms", "38.1 dB").
UNIT = r"(?:ms|req/s|[KMG]i?B|dB)"
UNIT_IN_HEADER = re.compile(rf"(?<![\w/]){UNIT}(?![\w/])")
FIGURE_CELL = re.compile(rf"^[*`(≈~]*[-−]?\d[\d,.]*(?:\s*[-–/]\s*[\d,.]+)*\s*{UNIT}(?![\w/])")
MEASUREMENTS = ROOT / "docs" / "measurements"
SOURCE_WITHIN = 6  # lines before a table's header or after its last row


@dataclass(frozen=True)
class Table:
    line: int  # 1-based, its header row
    rows: list[str]
    sources: list[str]  # link targets in the table and within SOURCE_WITHIN lines of it

    @property
    def measured(self) -> bool:
        cells = [c.strip() for row in self.rows[2:] for c in row.strip().strip("|").split("|")]
        return bool(UNIT_IN_HEADER.search(self.rows[0])) or any(map(FIGURE_CELL.match, cells))


def tables(text: str) -> list[Table]:
    """A page's markdown tables (a `|` row, then a `|---|` row, then `|` rows), code
    blocks left out, each with the link targets written near it."""
    lines = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text).split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and re.match(
            r"\|\s*:?-", lines[i + 1] if i + 1 < len(lines) else ""
        ):
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            near = "\n".join(lines[max(0, i - SOURCE_WITHIN) : end + SOURCE_WITHIN])
            out.append(Table(i + 1, lines[i:end], re.findall(r"\]\(([^)\s]+)\)", near)))
            i = end
        else:
            i += 1
    return out


def unsourced(page: Path, text: str) -> list[str]:
    """The measured tables of a page that link no existing file under docs/measurements/."""
    problems = []
    for table in tables(text):
        targets = [(page.parent / t.partition("#")[0]).resolve() for t in table.sources]
        if table.measured and not any(
            t.is_relative_to(MEASUREMENTS) and t.is_file() for t in targets
        ):
            problems.append(f"{page.relative_to(ROOT)}:{table.line}: {table.rows[0][:60]}")
    return problems


def test_every_table_of_measured_figures_links_its_source() -> None:
    """Every table in docs/ with a column in ms, req/s, KB/MB/GB (or KiB/MiB/GiB) or dB (in
    its header, or a cell that starts with a figure in one) links the stored run it comes
    from: a markdown link to an existing file under docs/measurements/, in the table or
    within SOURCE_WITHIN lines before its header or after its last row. The stored runs
    themselves (docs/measurements/) are the sources and are not checked."""
    pages = [p for p in PAGES if p.is_relative_to(ROOT / "docs")]
    pages = [p for p in pages if not p.is_relative_to(MEASUREMENTS)]
    checked = [t for p in pages for t in tables(p.read_text(encoding="utf-8")) if t.measured]
    assert len(checked) >= 10, "the pages' tables of measured figures were not found"
    problems = [line for p in pages for line in unsourced(p, p.read_text(encoding="utf-8"))]
    assert not problems, "no link to docs/measurements/ near:\n" + "\n".join(problems)


def test_a_table_of_measured_figures_without_a_source_is_caught() -> None:
    page = ROOT / "docs" / "example.md"
    table = "| model | p50 ms |\n|---|---:|\n| digits | 0.06 |\n"
    rules = "| rule | bound |\n|---|---|\n| sqnr | `--min-sqnr` (int8 20 dB) |\n"
    cited = "From [the run](measurements/bench-full.md):\n\n" + table
    assert unsourced(page, "Text.\n\n" + table) == ["docs/example.md:3: | model | p50 ms |"]
    assert unsourced(page, cited) == []
    assert unsourced(page, cited.replace("bench-full.md", "no-such-run.md")) != []
    assert unsourced(page, "[elsewhere](serving.md)\n\n" + table) != []
    assert unsourced(page, rules) == []  # a threshold is not a measurement
