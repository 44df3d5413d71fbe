"""Defaults the command line shows before any stage runs, importable without torch.

`pipeline --help` and every `pipeline STAGE --help` build their parser from these
(and from the format registry's declared names, pipeline/formats/base.py), so that
asking for help loads no torch, numpy or ONNX; the stages use the same names.
"""

from __future__ import annotations

DEFAULT_ATOL = 1e-5  # fp32 on CPU; see issue 2 / DESIGN.md
DEFAULT_RTOL = 1e-4
# The model every stage uses without --model. pipeline.zoo re-exports it for the
# stages; tests/unit/test_cli_imports.py checks the zoo has that model.
DEFAULT_MODEL = "digits_lenet"
