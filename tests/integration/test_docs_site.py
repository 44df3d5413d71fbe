"""The docs site (`make docs`): MkDocs builds it strictly, with the CLI reference generated
from the parser; a broken link, an anchor that does not exist or a page left out of the
navigation fails the build, naming it."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(root / "mkdocs.yml"), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300, cwd=root,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def test_the_site_builds_strictly_with_a_generated_cli_reference(tmp_path: Path) -> None:
    proc = _build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    from pipeline.cli import build_parser

    # Every stage, deploy's targets too, with its options as --help prints them.
    (stages,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in stages.choices:
        assert f"pipeline {name}</h2>" in cli or f'id="pipeline-{name}"' in cli, name
    assert "--trust PUBKEY" in cli and "pipeline deploy kserve" in cli
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'href="security/"' in home  # SECURITY.md, linked from the README, is a page


def test_a_broken_link_an_anchor_and_an_unlisted_page_fail_the_build(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", root / "docs", ignore=shutil.ignore_patterns("parity_bisect"))
    for name in ("mkdocs.yml", "README.md", "SECURITY.md"):
        shutil.copy2(ROOT / name, root / name)
    (root / "cpp_client").mkdir()
    shutil.copy2(ROOT / "cpp_client" / "README.md", root / "cpp_client" / "README.md")
    with (root / "docs" / "training.md").open("a") as page:
        page.write("\n[gone](no-such-page.md) and [nowhere](export.md#no-such-anchor)\n")
    (root / "docs" / "orphan.md").write_text("# Not in the navigation\n")
    proc = _build(root, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr and "no-such-anchor" in proc.stderr, proc.stderr
    assert "orphan.md" in proc.stderr, proc.stderr
