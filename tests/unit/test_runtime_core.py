"""The runtime contract's width (issue 50): a core of at most eight methods every runtime
implements, and capabilities a runtime holds or not, with one way to say "not
supported" (None). The tests' bare runtime implements the core and nothing else."""

from __future__ import annotations

import inspect

import pytest

from pipeline.serving import capabilities, runtime
from pipeline.serving.capabilities import PrivateSettings
from tests import toy_runtime

CAPABILITIES = {
    "versions": capabilities.Versions,
    "shadow": capabilities.Shadow,
    "bench_report": capabilities.BenchReport,
    "deploy": capabilities.Deploy,
    "packaging": capabilities.Packaging,
    "commands": capabilities.Commands,
    "nodes": capabilities.Nodes,
}


def _methods(cls: type) -> set[str]:
    """The methods and properties `cls` defines itself (identity attributes are not)."""
    return {
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    }


def test_the_core_asks_for_at_most_eight_methods_and_nothing_else() -> None:
    assert len(runtime.Runtime.__abstractmethods__) <= 8
    assert _methods(runtime.Runtime) == set(runtime.Runtime.__abstractmethods__)
    for name in CAPABILITIES:
        assert getattr(runtime.Runtime, name) is None, name  # absent unless a runtime offers it


def test_the_bare_runtime_implements_the_core_and_offers_no_capability() -> None:
    bare = toy_runtime.BARE_RUNTIME
    assert _methods(type(bare)) == set(runtime.Runtime.__abstractmethods__)
    assert all(getattr(bare, name) is None for name in CAPABILITIES)
    with pytest.raises(ValueError, match="has no live shadow check"):
        bare.private(None, "onnx", PrivateSettings(shadow_rate=0.5)).__enter__()  # type: ignore[arg-type]


def test_each_capability_a_runtime_offers_is_of_its_type() -> None:
    offered = {}
    for rt in (*runtime.all_runtimes(), toy_runtime.RUNTIME, toy_runtime.BARE_RUNTIME):
        for name, kind in CAPABILITIES.items():
            value = getattr(rt, name)
            assert value is None or isinstance(value, kind), (rt.name, name, value)
            if value is not None:
                offered.setdefault(name, []).append(rt.name)
    # What the built-in runtimes and the toy offer today (docs/internals.md's table).
    assert offered == {
        "versions": ["torchserve", "kserve", "toy"],
        "shadow": ["torchserve", "kserve"],
        "bench_report": ["torchserve", "kserve"],
        "deploy": ["kserve", "ray"],
        "packaging": ["torchserve"],
        "commands": ["torchserve"],
        "nodes": ["ray"],
    }
