"""Words of the CLI a Ray user meets (a user's trial, 2026-11-29): `serve --runtime ray
--format onnx` said "--format is for --runtime kserve" without naming --ray-format, the
option that does it on Ray; `infer --help` named TorchServe and KServe only."""

from __future__ import annotations

import contextlib
import io

import pytest

from pipeline.cli import build_parser, main
from pipeline.cli.deploy import refuse_other_runtimes
from pipeline.core.errors import PipelineError


def test_another_runtimes_option_names_the_runtimes_own() -> None:
    args = build_parser().parse_args(["serve", "--runtime", "ray", "--format", "onnx"])
    with pytest.raises(PipelineError) as refused:
        refuse_other_runtimes(args)
    said = str(refused.value)
    assert said.startswith("--format is for --runtime kserve, not ray"), said
    assert "use --ray-format" in said, said
    # An option with no counterpart on the runtime asked for names none.
    args = build_parser().parse_args(["serve", "--runtime", "kserve", "--live-versions"])
    with pytest.raises(PipelineError) as refused:
        refuse_other_runtimes(args)
    assert " use " not in str(refused.value)


def test_infer_help_describes_ray_too() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["infer", "--help"])
    said = " ".join(out.getvalue().split())
    assert "the KServe and Ray Serve runtimes get it as an Open Inference Protocol request" in said
