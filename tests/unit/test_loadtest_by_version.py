"""`pipeline loadtest --by-version` with a broken folder in the store (a user's trial,
2026-11-29): `cp -r model_store/digits_mlp/1 model_store/digits_lenet/3` ended every run
at start ("…/digits_lenet/3 holds an export of 'digits_mlp', not 'digits_lenet'"), though
version 3 was never served: every published version was opened before the first request.
A version's folder is opened when that version answers; one that cannot be makes its own
answers unchecked (wrong, saying why), never the run's end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.core.errors import ArtifactError
from pipeline.serving import loadtest, versions, wire
from pipeline.serving.loadjudge import UncheckedVersionError


@dataclass
class _Export:
    """An export whose eager model adds `offset` to its input."""

    name: str
    offset: float

    def sample(self, n: int, seed: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((n, 2), float(seed))}

    def eager(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"y": inputs["x"] + self.offset}


class _Protocol:
    def encode(self, inputs: dict[str, torch.Tensor], binary: bool = False) -> wire.Body:
        return wire.Body(b"{}")

    def encode_as(self, body: wire.Body, content_type: str | None) -> wire.Body:
        return body


class _Runtime:
    protocol = _Protocol()


@dataclass(frozen=True)
class _Version:
    model: str
    number: int
    dir: Path

    def open(self) -> Any:
        if self.number == 3:  # another model's export copied in as version 3
            raise ArtifactError(f"{self.dir} holds an export of 'digits_mlp', not {self.model!r}.")
        return _Export(self.model, float(self.number))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    held = [_Version("digits_lenet", n, tmp_path / "digits_lenet" / str(n)) for n in (1, 2, 3)]

    def listed(model: str, store: Path = tmp_path) -> list[_Version]:
        return held

    monkeypatch.setattr(versions, "versions", listed)
    return tmp_path


def _pool(store: Path | None) -> Any:
    config = loadtest.LoadConfig(export_dir=Path("unused"), pool=4, store=store)
    _, expected = loadtest._inputs_pool(config, _Export("digits_lenet", 0.0), _Runtime())
    return expected


def test_a_broken_folder_of_a_version_that_never_answered_does_not_end_the_run(
    store: Path,
) -> None:
    expected = _pool(store)  # before the fix: ArtifactError here, the run never started
    two = asyncio.run(expected.of("2"))
    assert torch.equal(two[1]["y"], torch.full((1, 2), 3.0))  # version 2's own eager: x + 2
    unnamed = asyncio.run(expected.of(None))
    assert torch.equal(unnamed[1]["y"], torch.full((1, 2), 1.0))  # the export's: x + 0


def test_answers_of_a_broken_or_unheld_version_are_unchecked_saying_why(store: Path) -> None:
    expected = _pool(store)
    with pytest.raises(UncheckedVersionError, match="version 3 answered, but its folder cannot be"):
        asyncio.run(expected.of("3"))
    with pytest.raises(UncheckedVersionError, match=r"version 7, which .* does not hold, answered"):
        asyncio.run(expected.of("7"))
    assert torch.equal(asyncio.run(expected.of("1"))[0]["y"], torch.full((1, 2), 1.0))


def test_without_a_store_every_answer_is_held_to_the_export() -> None:
    expected = _pool(None)
    assert torch.equal(asyncio.run(expected.of("2"))[0]["y"], torch.zeros(1, 2))
