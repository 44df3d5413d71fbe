"""`pipeline --help` and every `pipeline STAGE --help` load none of the heavy libraries.

The parser is built from torch-free names (pipeline.core.defaults, core.paths and the
format registry's declared names); each stage imports its libraries when it runs. The
torch-free copies are checked here against what the stages themselves use. Nothing is
timed: what is checked is which modules a fresh interpreter holds after asking for help.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import verify as cli_verify
from pipeline.core import defaults, paths
from pipeline.formats import base as registry

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "onnx", "onnxruntime", "sklearn", "httpx", "aiohttp", "kserve")

# Runs in a fresh interpreter: main(["--help"]) and `STAGE [TARGET] --help` for every
# sub-command the parser has, then prints the heavy modules loaded, and the commands.
_PROBE = """
import argparse, contextlib, io, json, sys
from pipeline.cli import build_parser, main

def helps(parser, prefix):
    yield [*prefix, "--help"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from helps(sub, [*prefix, name])

asked = list(helps(build_parser(), []))
for argv in asked:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
print(json.dumps({"asked": asked, "heavy": heavy}))
"""


def test_help_imports_no_heavy_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE % (HEAVY,)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    stages = {tuple(argv[:-1]) for argv in found["asked"]}
    assert {("export",), ("verify",), ("serve",), ("latency",), ("deploy", "kserve")} <= stages
    assert found["heavy"] == [], f"asking for help imported {found['heavy']}"


def test_declared_format_names_are_the_registered_ones() -> None:
    formats = registry.all_formats()  # imports every format module
    assert (
        tuple(registry.Declared.of(f) for f in formats if f.key in registry.BUILTIN)
        == registry.BUILTIN_FORMATS
    )
    assert registry.declared() == tuple(
        registry.Declared.of(f) if f.key in registry.BUILTIN else f for f in formats
    )
    assert registry.keys() == tuple(f.key for f in formats)
    assert registry.default_keys() == tuple(f.key for f in formats if f.default)


def test_a_builtin_format_that_differs_from_its_declaration_is_refused() -> None:
    fmt = registry.get("onnx")
    with pytest.raises(ValueError, match="declares"):
        registry.register(dataclasses.replace(fmt, title="Open Neural Network Exchange"))


def test_the_torch_free_defaults_are_the_ones_the_stages_use() -> None:
    from pipeline.core import compare
    from pipeline.formats import onnx, torchscript
    from pipeline.runtimes.torchserve import archive
    from pipeline.serving import runtime
    from pipeline.verify import backends
    from pipeline.zoo import DEFAULT_MODEL, zoo_names

    assert (compare.DEFAULT_ATOL, compare.DEFAULT_RTOL) == (
        defaults.DEFAULT_ATOL,
        defaults.DEFAULT_RTOL,
    )
    assert defaults.DEFAULT_MODEL == DEFAULT_MODEL and DEFAULT_MODEL in zoo_names()
    assert paths.DEFAULT_STORE == archive.DEFAULT_STORE
    assert onnx.DEFAULT_OPSET == registry.DEFAULT_OPSET
    assert torchscript.METHODS == registry.METHODS
    assert cli_verify.backend_names() == (*backends.backend_names(), *runtime.names())
    assert runtime.names() == tuple(r.name for r in runtime.all_runtimes())
