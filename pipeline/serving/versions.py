"""The versioned model store: every published export, numbered, with what vouches for it.

The layout is Triton's model repository (`<model>/<version>/`), inside the same
`model_store/` that holds TorchServe's archives:

    model_store/
      digits_lenet_ts.mar          TorchServe's archives stay flat (TorchServe reads its
                                   store as one folder of .mar files)
      digits_lenet/                one folder per model (its slug: torchvision_resnet18)
        1/                         the export folder as export wrote it (manifest.json,
          publish.json             artifacts, golden I/O), plus its provenance: the
          parity.json              checkpoint and the verify report behind it
        2/
        versions.json              the default-version pointer and its history

Versions are increasing integers and never reused: a version's folder is written
under a temporary name and renamed into place, so a reader sees all of it or none.
The pointer (`versions.json`) survives stop and serve: `pipeline serve` serves the
default version, `pipeline rollout` and `pipeline rollback` move it.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core import paths, signing
from pipeline.core.checkpoint import sidecar_path
from pipeline.core.errors import PipelineError
from pipeline.core.fileio import staging_dir, sweep_abandoned, write_json
from pipeline.core.manifest import read_manifest

if TYPE_CHECKING:
    from pipeline.export.opened import ExportedModel

POINTER = "versions.json"
PROVENANCE = signing.PROVENANCE  # publish.json
REPORT = "parity.json"
CHECKPOINT = "checkpoint.pt"  # export.opened.OWN_CHECKPOINT: open_export finds it there


class VersionError(PipelineError):
    """The store has no such model or version, or cannot take this export."""


@dataclass(frozen=True)
class Version:
    """One published export: `model_store/<model>/<number>/`."""

    model: str
    number: int
    dir: Path

    @property
    def checkpoint(self) -> Path:
        """Its own copy of the checkpoint (the eager reference verify and loadtest use)."""
        return self.dir / CHECKPOINT

    def open(self) -> ExportedModel:
        from pipeline.export.opened import open_export

        return open_export(self.dir, model=self.model, checkpoint=self.checkpoint)

    def provenance(self) -> dict[str, Any]:
        path = self.dir / PROVENANCE
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise VersionError(f"{path} is missing or unreadable ({err}).") from None


@dataclass
class Pointer:
    """`versions.json`: the default version and the defaults before it (newest last)."""

    default: int | None = None
    history: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"default": self.default, "history": self.history}


def refuse_other_store(served_dir: str | Path, store: Path) -> None:
    """A rollout or rollback takes its versions from the store the server serves, whose
    checks, trust policy and default pointer apply: another `--store` loaded that store's
    version N into the server as N (its own store's N had other weights), past the
    server's trust policy, and moved the other store's pointer. `served_dir`: the
    version the server serves now (an export folder outside any store: not checked here)."""
    if number_of(Path(served_dir)) is None:
        return
    serving = signing.store_of(Path(served_dir))
    if Path(serving).resolve() != Path(store).resolve():
        raise VersionError(
            f"The server serves this model from the store {serving}; --store {store} is "
            "another one. Versions are rolled out and back within the store the server "
            f"serves: pass --store {serving} (or serve from {store})."
        )


def number_of(export_dir: Path) -> int | None:
    """The version a store folder holds (its publish.json), None for an export folder."""
    try:
        return int(json.loads((Path(export_dir) / PROVENANCE).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def model_folder(model: str, store: Path = paths.DEFAULT_STORE) -> Path:
    return Path(store).resolve() / paths.model_slug(model)


def versions(model: str, store: Path = paths.DEFAULT_STORE) -> list[Version]:
    """The model's published versions, oldest first (none: an empty list)."""
    folder = model_folder(model, store)
    if not folder.is_dir():
        return []
    # By canonical names only: "02" beside "2" was listed twice as version 2 (status read
    # one folder, archive the other), and "²" passed isdigit() and failed int().
    found = [
        Version(model, number, p)
        for p in folder.iterdir()
        if (number := signing.version_number(p.name)) is not None
        and p.is_dir()
        and (p / PROVENANCE).is_file()
    ]
    return sorted(found, key=lambda v: v.number)


def get(model: str, number: int, store: Path = paths.DEFAULT_STORE) -> Version:
    for v in versions(model, store):
        if v.number == number:
            return v
    held = [v.number for v in versions(model, store)]
    raise VersionError(
        f"{model} has no version {number} in {store}"
        + (
            f"; it has {', '.join(map(str, held))}."
            if held
            else f"; publish one with `pipeline publish --model {model}`."
        )
    )


def read_pointer(model: str, store: Path = paths.DEFAULT_STORE) -> Pointer:
    path = model_folder(model, store) / POINTER
    if not path.is_file():
        return Pointer()
    try:
        data = json.loads(path.read_text())
        return Pointer(data.get("default"), [int(v) for v in data.get("history", [])])
    except (OSError, ValueError, TypeError) as err:
        raise VersionError(f"{path} is unreadable ({err}); it names the default version.") from None


def write_pointer(model: str, pointer: Pointer, store: Path = paths.DEFAULT_STORE) -> None:
    write_json(model_folder(model, store) / POINTER, pointer.to_json())


def default(model: str, store: Path = paths.DEFAULT_STORE) -> Version | None:
    """The version `pipeline serve` serves: the pointer's, else the newest; None: none."""
    pointer = read_pointer(model, store)
    if pointer.default is not None:
        return get(model, pointer.default, store)
    held = versions(model, store)
    return held[-1] if held else None


def set_default(model: str, number: int, store: Path = paths.DEFAULT_STORE) -> Pointer:
    """Point the default at `number` (which must exist); the old default joins the history."""
    get(model, number, store)
    pointer = read_pointer(model, store)
    if pointer.default != number:
        if pointer.default is not None:
            pointer.history.append(pointer.default)
        pointer.default = number
        write_pointer(model, pointer, store)
    return pointer


def previous(model: str, store: Path = paths.DEFAULT_STORE) -> int:
    """The default before the current one (what a rollback returns to)."""
    pointer = read_pointer(model, store)
    earlier = [v for v in pointer.history if v != pointer.default]
    if not earlier:
        raise VersionError(
            f"{model} has no earlier default to roll back to (default {pointer.default}, "
            "history empty)."
        )
    return earlier[-1]


def roll_back_pointer(model: str, store: Path = paths.DEFAULT_STORE) -> Pointer:
    """The default moves back to the previous one, which leaves the history."""
    back = previous(model, store)
    pointer = read_pointer(model, store)
    last = max(i for i, v in enumerate(pointer.history) if v == back)
    pointer.history, pointer.default = pointer.history[:last], back
    write_pointer(model, pointer, store)
    return pointer


@dataclass
class Published:
    version: Version
    report: Path
    made_default: bool
    signer: str | None = None  # the signing key's fingerprint, when signed


def next_number(folder: Path) -> int:
    """The number a new version in the model's `folder` gets. Every numbered folder counts,
    published or not ("03" too): a number is never used twice."""
    # ASCII digits: a folder "²" passed isdigit() and failed int(), and publish with it.
    used = [int(p.name) for p in folder.iterdir() if p.name.isascii() and p.name.isdigit()]
    return max([0, *used]) + 1


def publish(
    model: str,
    export_dir: Path,
    report: Path,
    checkpoint: Path,
    store: Path = paths.DEFAULT_STORE,
    *,
    sign: Path | None = None,
    key_password: str | None = None,
) -> Published:
    """Copy the export in `export_dir` into the store as the model's next version, with the
    passing verify `report` and the `checkpoint` behind it. The first version becomes the
    default; later ones wait for `pipeline rollout`. `sign`: an elliptic-curve private key
    the version is signed with before it appears (pipeline/serving/signing.py)."""
    manifest = read_manifest(export_dir)  # PipelineError when missing or unreadable
    if manifest.model.name != model:
        raise VersionError(f"{export_dir} holds {manifest.model.name!r}, not {model!r}.")
    if not Path(checkpoint).is_file():
        raise VersionError(f"The checkpoint {checkpoint} behind {export_dir} is missing.")
    parity = json.loads(Path(report).read_text())
    folder = model_folder(model, store)
    folder.mkdir(parents=True, exist_ok=True)
    number = next_number(folder)
    sweep_abandoned(folder)  # an earlier publish's, killed mid-way
    staging = staging_dir(f".{number}.", folder)
    try:
        target = staging / "v"
        # Not a signature the folder may carry (published from another version): it
        # would not match this version's files, and --sign writes this version's own.
        shutil.copytree(
            export_dir, target, ignore=shutil.ignore_patterns("__pycache__", signing.SIGNATURE)
        )
        shutil.copy2(report, target / REPORT)
        shutil.copy2(checkpoint, target / CHECKPOINT)
        shutil.copy2(sidecar_path(Path(checkpoint)), sidecar_path(target / CHECKPOINT))
        write_json(
            target / PROVENANCE,
            {
                "model": model,
                "version": number,
                "published": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "source": str(Path(export_dir).resolve()),
                "checkpoint": manifest.checkpoint.to_json() | {"copied_from": str(checkpoint)},
                "formats": sorted(k for k in manifest.artifacts if k not in manifest.failed),
                "verify": {
                    "report": REPORT,
                    "passed": bool(parity.get("passed")),
                    "created": parity.get("created"),
                    "checks": len(parity.get("rows", [])),
                },
            },
        )
        signer = signing.sign(target, sign, key_password) if sign is not None else None
        target.rename(folder / str(number))  # signed before it appears: never seen unsigned
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    version = Version(model, number, folder / str(number))
    first = read_pointer(model, store).default is None
    if first:
        set_default(model, number, store)
    return Published(version, folder / str(number) / REPORT, first, signer)


def _digests(artifacts: dict[str, Any]) -> dict[str, str]:
    return {key: a.sha256 for key, a in artifacts.items()}


def holding(model: str, export_dir: Path, store: Path = paths.DEFAULT_STORE) -> Version | None:
    """The published version whose artifacts are `export_dir`'s, byte for byte (by their
    recorded sha256s), if any: publishing an export twice made two identical versions and
    said nothing, and a rollout between them changes nothing."""
    mine = _digests(read_manifest(Path(export_dir)).artifacts)
    for version in versions(model, store):
        try:
            if _digests(read_manifest(version.dir).artifacts) == mine:
                return version
        except PipelineError:
            continue  # a broken version is not this export; serve and rollout say why
    return None


def not_the_default(model: str, export_dir: Path, store: Path = paths.DEFAULT_STORE) -> str | None:
    """A warning when `store` serves `model` at a default version whose artifacts are not
    those of `export_dir` (a deployment of the working export, after a rollback, packed
    what `pipeline serve` no longer serves); None when they agree or nothing is published."""
    try:
        version = default(model, store)
        if version is None or Path(export_dir).resolve() == version.dir.resolve():
            return None
        theirs = read_manifest(version.dir).artifacts
        mine = read_manifest(Path(export_dir)).artifacts
    except PipelineError:
        return None  # no readable export or store here: the deploy says what is missing
    if _digests(mine) == _digests(theirs):
        return None
    return (
        f"{export_dir} is not version {version.number} of {model}, the store's default that "
        f"`pipeline serve` serves; to deploy that one, pass --export-dir {version.dir}"
    )
