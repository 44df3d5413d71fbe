"""TorchServe's model store: which `.mar` archives `pipeline serve` starts, and the
names clients may use for them.

Each archive carries `archive.json` (pipeline.serving.provenance.ServedInfo, `read_info`): its
model, format and provenance. One archive per model is served by default, the
format `served.preferred_format` picks (bench's fastest within the budget, else the
registry's first).
"""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Iterable
from pathlib import Path

from pipeline.core import paths, signing
from pipeline.runtimes.torchserve.constants import ARCHIVE_INFO
from pipeline.serving import versions
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.served import preferred_format
from pipeline.serving.server import ServeError, Server

log = logging.getLogger(__name__)


def read_info(mar: Path) -> ServedInfo | None:
    """The `archive.json` inside `mar`; None for an archive without one (another tool's)."""
    try:
        with zipfile.ZipFile(mar) as zf:
            return ServedInfo.from_json(json.loads(zf.read(ARCHIVE_INFO)))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def archive_infos(store: Path, archives: Iterable[str]) -> dict[str, ServedInfo]:
    """Each archive's archive.json (archives without one are left out)."""
    found = {name: read_info(Path(store) / f"{name}.mar") for name in archives}
    return {name: info for name, info in found.items() if info is not None}


def by_model(infos: dict[str, ServedInfo]) -> dict[str, dict[str, str]]:
    """model → {format: archive name}, from the archives' own records."""
    out: dict[str, dict[str, str]] = {}
    for name, info in sorted(infos.items()):
        out.setdefault(info.model, {}).setdefault(info.format, name)
    return out


def _preferred(formats: dict[str, str], infos: dict[str, ServedInfo]) -> str:
    """The archive to serve of one model's archives ({format: archive name})."""
    fastest = next((infos[n].fastest for n in formats.values() if infos[n].fastest), None)
    return formats[preferred_format(formats, fastest)]


def preferred_archives(store: Path, archives: list[str]) -> list[str]:
    """One archive per model (`preferred_format` of those archived); every archive
    without archive.json (another tool's), since nothing says what it holds."""
    infos = archive_infos(store, archives)
    chosen = [name for name in archives if name not in infos]
    chosen += [_preferred(formats, infos) for formats in by_model(infos).values()]
    return sorted(chosen)


def expand(store: Path, archives: list[str], names: list[str], every: bool = False) -> list[str]:
    """`pipeline serve --models`: archive names as given, model names (as exported:
    digits_lenet, torchvision:resnet18) as their preferred archive (`every`: all their
    archives). ValueError names what is neither."""
    infos = archive_infos(store, archives)
    models = by_model(infos)
    slugs = {paths.model_slug(m): m for m in models}  # torchvision_resnet18 → torchvision:resnet18
    out: list[str] = []
    unknown = []
    for name in names:
        model = name if name in models else slugs.get(paths.model_slug(name))
        if name in archives:
            out.append(name)
        elif model is not None:
            formats = models[model]
            out += formats.values() if every else [_preferred(formats, infos)]
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)}: no such archive or archived model in {store} (it holds "
            f"{', '.join(archives) or 'nothing'})"
        )
    return list(dict.fromkeys(out))


def aliases(server: Server) -> dict[str, str]:
    """Model name (and its slug: torchvision_resnet18) → archive, for each model the
    server serves in one format, so clients can ask for the model whatever its format.
    A name that is itself an archive's is never an alias."""
    out: dict[str, str] = {}
    for model in {info.model for info in server.served.values()}:
        mine = server.served_of(model)
        if len(mine) == 1:
            for name in (model, paths.model_slug(model)):
                if name not in server.served and name not in server.models:
                    out[name] = next(iter(mine))
    return dict(sorted(out.items()))


def _archived(mar: Path, key: str) -> str | None:
    """`key` of the model model-archiver described in `mar` (MAR-INF/MANIFEST.json)."""
    try:
        with zipfile.ZipFile(mar) as zf:
            return str(json.loads(zf.read("MAR-INF/MANIFEST.json"))["model"][key])
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):
        return None


def archive_model_name(mar: Path) -> str | None:
    """The model name `mar` registers under in TorchServe."""
    return _archived(mar, "modelName")


def archive_version(mar: Path) -> str | None:
    """The model version model-archiver wrote into `mar`."""
    return _archived(mar, "modelVersion")


def follow_defaults(store: Path, archives: Iterable[str]) -> list[str]:
    """Archive again each of `archives` whose model is published in `store` at another
    version than the store's default (`pipeline rollout` or `rollback` moved it since), so
    `pipeline serve` serves the default version, as the KServe runtime does; under a trust
    policy, also each that is not what archiving the signed version gives (signed.py).
    Returns the archives it rewrote."""
    from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive, settings_of
    from pipeline.runtimes.torchserve.signed import to_rebuild

    rewritten = []
    for name, info in archive_infos(store, archives).items():
        published = versions.default(info.model, store)
        if published is None or misnamed(name, info):
            continue  # a misnamed one would be archived again under its own name (untied)
        trusted = signing.require(published.dir)  # the trust policy, when there is one
        mar = Path(store) / f"{name}.mar"
        # At the default version, it is kept unless a trust policy is in force and it no
        # longer holds the signed bytes and this installation's code.
        current = archive_version(mar) == str(published.number)
        if current and not (
            trusted and to_rebuild(mar, published.dir, info.format, published.number)
        ):
            continue
        log.info("archiving %s at version %d, the store's default", name, published.number)
        archive(
            ArchiveConfig(
                model=info.model,
                export_dir=published.dir,
                store=Path(store),
                formats=(info.format,),
                version=str(published.number),
                bench_results=None,
                **settings_of(mar),  # batch size, workers, timeouts: as archived before
            )
        )
        rewritten.append(name)
    return rewritten


def misnamed(name: str, info: ServedInfo) -> bool:
    """Whether archive `name` is not the name archiving its model and format gives."""
    return name != _canonical(info)


def untied(store: Path, archives: Iterable[str]) -> list[str]:
    """Under a trust policy, which of `archives` no published version vouches for: those
    without archive.json, whose archive.json names a model the store does not publish, or
    that are not named as archiving that model gives. follow_defaults checks every other
    one against its signed version; these were served unchecked, handler code and all (an
    archive.json renamed to another model was enough, and a copy of a published model's
    archive under another file name: the check rebuilt `<model>_<fmt>.mar` beside it)."""
    if not signing.Policy.load(Path(store)).declared:
        return []
    infos = archive_infos(store, archives)
    found = []
    for name in archives:
        info = infos.get(name)
        if info is None:
            found.append(f"{name}.mar (it has no archive.json)")
        elif versions.default(info.model, store) is None:
            found.append(
                f"{name}.mar (its archive.json names {info.model}, which {store} does not publish)"
            )
        elif misnamed(name, info):
            found.append(
                f"{name}.mar (its archive.json names {info.model} in {info.format}, archived "
                f"as {_canonical(info)}.mar; no check reads an archive under another name)"
            )
    return found


def _canonical(info: ServedInfo) -> str:
    from pipeline.runtimes.torchserve.archive import archive_name

    return archive_name(info.model, info.format)


def refuse_untied(store: Path, archives: Iterable[str]) -> None:
    """ServeError naming the `untied` archives, if any; and, policy or not, an archive whose
    own model name (MAR-INF/MANIFEST.json) is not its file's: TorchServe registers it
    under the former, and serve waited its whole start-up timeout for the latter."""
    archives = list(archives)
    renamed = [
        f"{name}.mar holds the model {inner!r}"
        for name in archives
        if (inner := archive_model_name(Path(store) / f"{name}.mar")) not in (None, name)
    ]
    if renamed:
        raise ServeError(
            f"{'; '.join(renamed)} (MAR-INF/MANIFEST.json): TorchServe would serve it under "
            "that name. Name the file after its model again, or archive it anew "
            "(`pipeline archive --model MODEL`)."
        )
    if found := untied(store, archives):
        raise ServeError(
            f"Refused under the trust policy: {'; '.join(found)}. TorchServe runs an "
            "archive's handler code, and no signed version vouches for these: archive a "
            "signed version from the store (`pipeline archive --model MODEL`), or serve "
            "without a trust policy."
        )


def unarchived(store: Path, archives: list[str], wanted: list[str] | None) -> str:
    """What to run for the models published in `store` (those `wanted`, else every one)
    that TorchServe cannot serve yet: it serves `archives`, and these have none."""
    if not store.is_dir():
        return ""
    names = wanted or sorted(p.name for p in store.iterdir() if p.is_dir())
    infos = archive_infos(store, archives).values()
    held = {paths.model_slug(info.model) for info in infos}
    found = []
    for name in names:
        try:
            published = versions.default(name, store)
        except versions.VersionError:
            continue
        if published is not None and paths.model_slug(published.model) not in held:
            found.append(
                f"`pipeline archive --model {name} --store {store}` (its default, version "
                f"{published.number})"
            )
    if not found:
        return ""
    return (
        f" Published in the store but not archived: {'; '.join(found)}. The KServe and Ray "
        "runtimes serve a store's versions as they are (`--runtime kserve`)."
    )
