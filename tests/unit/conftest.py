"""Fixtures the unit tests of signed versions share (test_signing*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core import signing


@pytest.fixture
def no_trust_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # setenv first, so that teardown restores the variable's absence even after `main`
    # set it (--trust writes it into this process's environment): a policy left behind
    # would refuse every unsigned store the worker's later tests serve.
    monkeypatch.setenv(signing.TRUST_ENV, "")
    monkeypatch.delenv(signing.TRUST_ENV)
    signing._warned.clear()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("keys")
    found = {}
    for name in ("alice", "mallory"):
        signing.keygen(root / f"{name}.key")
        found[name] = root / f"{name}.key"
    return found
