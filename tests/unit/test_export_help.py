"""`pipeline export --help` names what the parsers behind it accept, so the help cannot
drift from them: every dtype `--input` takes, its LOW:HIGH range, and every format."""

from __future__ import annotations

import argparse
import re

from pipeline.cli import build_parser
from pipeline.formats import base as registry
from pipeline.zoo import spec


def _export_action(dest: str) -> argparse.Action:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices["export"]._actions if a.dest == dest)


def test_input_help_names_every_dtype_and_the_range() -> None:
    action = _export_action("input")
    assert action.metavar == "NAME:DTYPE:SHAPE[:LOW:HIGH]"
    words = re.findall(r"[\w:]+", action.help)
    assert set(spec._DTYPES) <= set(words), sorted(set(spec._DTYPES) - set(words))
    assert "LOW:HIGH" in action.help


def test_format_help_says_what_each_on_device_format_is() -> None:
    action = _export_action("format")
    on_device = set(registry.keys()) - set(registry.served_keys())
    assert on_device  # pte and pte_int8: what no runtime serves needs saying in the help
    words = re.findall(r"\w+", action.help)
    assert on_device <= set(words), sorted(on_device - set(words))
