"""Simulates PyTorch PR #189705 in every Python process started with this folder on
PYTHONPATH (`make demo JIT=refused`, tests/integration/test_jit_refused.py): the
`torch.jit` entry points raise RuntimeError with the text of torch 2.14's deprecation
warnings, unless TORCH_2_14_ONLY_UNSAFE_SILENCE_TORCHSCRIPT_ERROR holds the PR's exact
promise (read once, when torch is imported, as the PR does).

Python imports `sitecustomize` at start from the first folder on sys.path that has one,
so this reaches TorchServe's workers and multiprocessing children too (they inherit
PYTHONPATH). torch itself is imported as usual: a finder wraps its loader and patches
`torch.jit` once torch has finished importing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys

ESCAPE_ENV = "TORCH_2_14_ONLY_UNSAFE_SILENCE_TORCHSCRIPT_ERROR"
ESCAPE_VALUE = "I promise to migrate by 2.15"
SWITCH = "Please switch to `torch.compile` or `torch.export`."
# module of torch.jit -> entry point -> what torch 2.14 warns (the PR raises it instead)
REFUSED = {
    "torch.jit._script": {"script": SWITCH},
    "torch.jit._trace": {"trace": SWITCH, "trace_module": SWITCH},
    "torch.jit._serialization": {
        "load": "Please switch to `torch.export`.",
        "save": "Please switch to `torch.export`.",
    },
    "torch.jit._freeze": {"freeze": SWITCH, "optimize_for_inference": SWITCH},
}


def _refusing(name: str, advice: str):
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"`torch.jit.{name}` is deprecated. {advice}")

    return refuse


def _patch() -> None:
    if os.environ.get(ESCAPE_ENV) == ESCAPE_VALUE:
        return
    marks = os.environ.get("JIT_REFUSED_MARKS")  # a test's proof of which processes it reached
    if marks:
        program = os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "python")
        open(os.path.join(marks, f"{os.getpid()}-{program}"), "w").close()
    jit = sys.modules["torch.jit"]
    for module_name, names in REFUSED.items():
        module = sys.modules[module_name]
        for name, advice in names.items():
            stand_in = functools.wraps(getattr(module, name))(_refusing(name, advice))
            setattr(module, name, stand_in)
            setattr(jit, name, stand_in)


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _AfterTorch())
