"""MkDocs hooks for the docs site (`make docs`; mkdocs.yml names this file).

The site is built from docs/ plus the three pages that live elsewhere in the repository
(README.md as the home page, SECURITY.md, cpp_client/README.md), and a CLI reference
generated from the parser itself at build time, so `--help` and the docs cannot drift.
Links written for reading the repository on disk or on a forge (`../SECURITY.md`,
`docs/serving.md`, `../pipeline/runtimes/kserve/sweep.py`) are rewritten to the site's
pages; a link to a source file becomes the file's path in code, since the site holds no
source. Everything else a link points at is checked by `mkdocs build --strict`.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
# Repository files served as site pages: repository path → page.
OUTSIDE = {
    "README.md": "index.md",
    "SECURITY.md": "security.md",
    "cpp_client/README.md": "cpp-client-flags.md",
}
CLI_PAGE = "reference/cli.md"
MEASUREMENTS_PAGE = "measurements/index.md"
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def on_files(files: Files, config: Any) -> Files:
    for source, page in OUTSIDE.items():
        text = (ROOT / source).read_text()
        files.append(File.generated(config, page, content=_from_repo(text, source)))
    files.append(File.generated(config, CLI_PAGE, content=cli_reference()))
    files.append(File.generated(config, MEASUREMENTS_PAGE, content=_measurements(files)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.generated_by:  # written by on_files, links already rewritten
        return markdown
    return _from_repo(markdown, f"docs/{page.file.src_uri}")


def _from_repo(text: str, source: str) -> str:
    """`text` (the file at repository path `source`) with its links pointing at the site."""
    here = (ROOT / source).parent

    def fix(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return match.group(0)  # a URL, or an anchor on the same page
        path, _, anchor = target.partition("#")
        where = (here / path).resolve()
        rel = where.relative_to(ROOT).as_posix() if where.is_relative_to(ROOT) else path
        suffix = f"#{anchor}" if anchor else ""
        if rel in OUTSIDE:
            page = OUTSIDE[rel]
        elif rel == "docs/measurements":
            page = MEASUREMENTS_PAGE
        elif rel == "docs/verify-example":
            page = "verify-example/parity.md"
        elif rel.startswith("docs/"):
            page = rel.removeprefix("docs/")
        else:  # a source file: the site holds none, so say which
            return label if label.strip("`") == rel else f"{label} (`{rel}`)"
        depth = len(Path(OUTSIDE.get(source, source.removeprefix("docs/"))).parts) - 1
        return f"[{label}]({'../' * depth}{page}{suffix})"

    return _LINK.sub(fix, text)


def _measurements(files: Files) -> str:
    pages = sorted(
        f.src_uri
        for f in files
        if f.src_uri.startswith("measurements/") and f.is_documentation_page()
    )
    lines = [
        "# Stored measurements",
        "",
        "Outputs of real runs, kept as they were printed; the pages that quote a figure link",
        "the run it comes from. Newest date last in each name.",
        "",
    ]
    lines += [f"- [{Path(p).stem}]({Path(p).name})" for p in pages if p != MEASUREMENTS_PAGE]
    return "\n".join(lines) + "\n"


def cli_reference() -> str:
    """Every stage's `--help`, from the parser the command line uses."""
    from pipeline.cli import build_parser

    parser = build_parser()
    out = [
        "# Command-line reference",
        "",
        "Generated from the command line's own parser when the site is built: what",
        "`pipeline STAGE --help` prints, for every stage.",
        "",
        "## pipeline",
        "",
        "```text",
        _help(parser),
        "```",
        "",
    ]
    for name, sub in _subcommands(parser):
        out += [f"## pipeline {name}", "", "```text", _help(sub), "```", ""]
        for target, nested in _subcommands(sub):
            out += [f"### pipeline {name} {target}", "", "```text", _help(nested), "```", ""]
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += list(action.choices.items())
    return found


def _help(parser: argparse.ArgumentParser) -> str:
    import os

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; a fixed width here
    return parser.format_help().rstrip()
