"""Verify's options and notes, from a user's trial (2026-11-28). Where it builds its C++
programs: `--cpp-build-dir` for the LibTorch client and `--pte-build-dir` for ExecuTorch's
runner, only once a format one of them runs is checked (`--cpp-build-dir` built the
LibTorch client, minutes of compiling, for an export it could run nothing of, and the
runner ignored it); and an unwritten format's note keeps export's whole reason."""

from __future__ import annotations

from pathlib import Path

from pipeline.cli import build_parser
from pipeline.verify import VerifyConfig


def test_the_build_folders_are_taken_and_nothing_is_built_while_parsing(tmp_path: Path) -> None:
    client, runner = tmp_path / "client", tmp_path / "runner"
    args = build_parser().parse_args(
        ["verify", "--with-cpp", "--cpp-build-dir", str(client), "--pte-build-dir", str(runner)]
    )
    config = VerifyConfig.from_args(args)
    assert (config.cpp_build_dir, config.pte_build_dir) == (client, runner)
    assert config.cpp_binary is None
    assert not client.exists() and not runner.exists()


def test_the_help_names_the_runners_own_build_folder() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["verify"].format_help()  # type: ignore[union-attr]
    assert "--pte-build-dir" in text and "build-cpp --runner pte --build-dir" in " ".join(
        text.split()
    )


def test_an_unwritten_formats_note_keeps_exports_hint() -> None:
    """The note cut export's reason at 300 characters, mid-hint ("Hint: torch.export cannot
    follow a Python `if` on a tensor's)"): the advice is the part a user needs."""
    from pipeline.formats.explain import COND_HINT
    from pipeline.verify import _whole

    reason = (
        "ExecuTorch .pte: torch.export failed at models/branchy.py:7 (if x.sum() > 0:) (the "
        "code branches on a tensor's value): GuardOnDataDependentSymNode: Could not guard on "
        "data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1)).  (Size-like symbols: "
        f"none).\n Hint: {COND_HINT}."
    )
    assert _whole(reason).endswith(f"Hint: {COND_HINT}.") and "\n" not in _whole(reason)
    long = "word " * 400
    assert _whole(long).endswith("word …") and len(_whole(long)) <= 1002
