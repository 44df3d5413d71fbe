"""What a server serves of a model: which format, and whether it is the export on disk.

One rule picks the format everywhere: `pipeline serve` (which format of a model
to serve), `loadtest --serve` (which format its private server serves) and the
clients (`infer`, `loadtest`, `verify --backend <runtime>`, through
`Server.served_of` and `client.resolve_model`): the fastest verified backend
`pipeline bench` measured, else the first format in registry order (TorchScript,
the reference serialisation).

`stale(...)` compares what a served name records about the export it was made
from (its `ServedInfo`: the artifact's and the checkpoint's sha256, the export's
time) with an export folder, and says in one sentence which is older and what
to run. A served model that answers from another export than the one a check
compares with fails every check; this says why before the failures do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.core import paths, signing
from pipeline.core.errors import PipelineError
from pipeline.core.manifest import MANIFEST_NAME, read_manifest
from pipeline.formats import base as registry
from pipeline.serving import runtime as runtimes
from pipeline.serving import versions
from pipeline.serving.provenance import ServedInfo, fastest_entry
from pipeline.serving.server import ServeError, Server, option_values, serve_options
from pipeline_runtime import formats, jitgate
from pipeline_runtime.manifest import ArtifactRecord, Manifest


class StaleServerError(ServeError):
    """The server answers from another export than the one being checked."""


def preferred_format(formats: Iterable[str], fastest: dict[str, Any] | None = None) -> str:
    """The format to serve out of `formats`: bench's fastest when among them, else the
    first in registry order (TorchScript), leaving out the formats this torch's refusal of
    torch.jit keeps it from loading. ValueError when `formats` is empty."""
    held = list(formats)
    if not held:
        raise ValueError("no format to choose from")
    if fastest and fastest.get("format") in held:
        return str(fastest["format"])
    needs_jit = {f.key for f in registry.declared() if f.needs_jit}
    if set(held) & needs_jit and set(held) - needs_jit and jitgate.refused():
        held = [f for f in held if f not in needs_jit]  # this torch cannot load them
    order = registry.keys()
    return min(held, key=lambda f: order.index(f) if f in order else len(order))


def export_format(manifest: Manifest, bench_results: Path | None = None) -> str:
    """The format `pipeline serve` would serve of this export once archived (what
    `loadtest --serve` and the KServe runtime serve when no format is asked for):
    bench's fastest within the accuracy budget (`within_budget`), else the first in
    registry order. ServeError when the export holds none."""
    return choose(manifest, fastest_entry(manifest.model.name, bench_results))[0]


def servable(manifest: Manifest) -> list[str]:
    """The formats of this export a runtime may serve, in registry order (an on-device
    format such as ExecuTorch's .pte is verified and benchmarked, never served)."""
    order = registry.keys()
    return [
        k
        for k in order
        if k in manifest.artifacts and formats.served(k, manifest.artifact(k).details)
    ]


def refuse_unserved(manifest: Manifest, fmt: str) -> None:
    """ServeError when `fmt` is a format no runtime serves, naming the ones that are."""
    if fmt in manifest.artifacts and not formats.served(fmt, manifest.artifact(fmt).details):
        held = servable(manifest)
        raise ServeError(
            f"{fmt} is an on-device format: export, verify and bench take it, no runtime "
            f"serves it; serve one this export holds ({', '.join(held) or 'none: export one'})."
        )


def choose(
    manifest: Manifest,
    fastest: dict[str, Any] | None,
    accuracy_budget: float | None = None,
    min_sqnr: float | None = None,
) -> tuple[str, str]:
    """(format, why): the format to serve of this export, and one sentence saying why."""
    held = servable(manifest)
    if not held:
        raise ServeError(
            f"The export of {manifest.model.name} holds no servable artifact; re-run `pipeline export`."
        )
    entry = within_budget(fastest, manifest, accuracy_budget, min_sqnr)
    fmt = preferred_format(held, entry)
    if entry is not None and entry.get("format") == fmt:
        return fmt, str(entry.get("why") or f"bench's fastest verified backend ({fmt})")
    if fastest and entry is None:
        reason = (
            f"none of bench's verified backends ({', '.join(_formats_of(fastest))}) is within "
            "the accuracy budget for this export"
        )
    elif fastest:
        reason = f"bench's fastest format ({fastest.get('format')}) is not archived here"
    else:
        reason = "no bench result to choose by"
    passed = [f for f in held[: held.index(fmt)] if registry.get(f).needs_jit]
    over = f", {' and '.join(passed)} passed over: this torch refuses torch.jit" if passed else ""
    return fmt, (
        f"{reason}: the first format held in registry order ({fmt}, "
        f"{registry.precision_of(fmt)}{over})"
    )


def _formats_of(fastest: dict[str, Any]) -> list[str]:
    candidates = fastest.get("candidates") or [fastest]
    return [str(c.get("format")) for c in candidates]


def quality_holds(
    record: ArtifactRecord, accuracy_budget: float | None = None, min_sqnr: float | None = None
) -> tuple[bool, str]:
    """Whether artifact `record` is within its accuracy budget as export measured it (the
    given budget instead of the recorded one when set), and the measurement in words."""
    precision = str(record.get("precision") or registry.precision_of(record.format))
    if precision == registry.FLOAT32:
        return True, "float32, which verify holds to eager elementwise"
    quality = record.get("quality")
    if not isinstance(quality, dict):
        return False, f"{precision}, never judged (export recorded no task-level verdict)"
    checks = [c for c in quality.get("checks", []) if isinstance(c, dict)]
    if accuracy_budget is None and min_sqnr is None:
        held = bool(quality.get("within_budget"))
    else:
        held = bool(checks) and all(_holds(c, accuracy_budget, min_sqnr) for c in checks)
    words = "; ".join(
        f"{c.get('metric')} {c.get('value')} {c.get('unit')} (bound {_bound(c, accuracy_budget, min_sqnr)})"
        for c in checks
    )
    return held, f"{precision}, {'within' if held else 'OUTSIDE'} the accuracy budget: {words}"


def _bound(check: dict[str, Any], accuracy_budget: float | None, min_sqnr: float | None) -> Any:
    given = min_sqnr if check.get("rule") == "sqnr" else accuracy_budget
    return check.get("bound") if given is None else given


def _holds(check: dict[str, Any], accuracy_budget: float | None, min_sqnr: float | None) -> bool:
    if check.get("kind") not in ("pass", "tolerance"):
        return False  # crashed, non-finite, vacuous: no budget makes those right
    try:
        value = float(check["value"])
        bound = float(_bound(check, accuracy_budget, min_sqnr))
    except (KeyError, TypeError, ValueError):
        return False
    return value >= bound if check.get("rule") == "sqnr" else value <= bound


def within_budget(
    fastest: dict[str, Any] | None,
    manifest: Manifest,
    accuracy_budget: float | None = None,
    min_sqnr: float | None = None,
) -> dict[str, Any] | None:
    """Bench's fastest entry for this export, chosen again so that its format is within
    the accuracy budget (the recorded one, or the one given): the fastest of bench's
    verified candidates whose artifact export judged within it. None when none is, or
    when bench measured nothing; the caller then serves the first format in registry order.
    Never a format outside the budget, even one bench ranked first on another export."""
    if not fastest:
        return None
    candidates = fastest.get("candidates") or [fastest]
    left_out = []
    for c in candidates:
        fmt = c.get("format")
        record = manifest.artifacts.get(str(fmt))
        if record is None:
            left_out.append(f"{fmt}: not in this export")
            continue
        held, words = quality_holds(record, accuracy_budget, min_sqnr)
        if held:
            overridden = accuracy_budget is not None or min_sqnr is not None
            if c is candidates[0] and fmt == fastest.get("format") and not overridden:
                return dict(fastest)  # bench's own pick stands: its record says why
            why = (
                f"{c.get('backend')} ({fmt}) is the fastest at batch 1 "
                f"({float(c.get('median_ms', 0)):.3f} ms median) of bench's verified "
                f"backends whose artifact is within the budget ({words})"
                + (f"; passed over: {'; '.join(left_out)}" if left_out else "")
            )
            return {
                **fastest,
                **{k: c[k] for k in ("backend", "format") if k in c},
                "median_ms": c.get("median_ms", fastest.get("median_ms")),
                "why": why,
            }
        left_out.append(f"{c.get('backend')} ({fmt}): {words}")
    return None


def _when(stamp: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        return None


def _origin(when: str, checkpoint: str) -> str:
    return f"exported {when or 'at an unrecorded time'} from checkpoint {checkpoint[:8] or 'unrecorded'}"


def stale(
    name: str,
    info: ServedInfo,
    manifest: Manifest,
    export_dir: Path,
    *,
    runtime: str | None = None,
    server: Server | None = None,
) -> str | None:
    """None when `name` was built from the export in `export_dir` (its artifact's
    sha256 is the manifest's, or its record holds nothing to compare); else one sentence
    saying which is older and what to run (to restart `server` as it was started, when
    given)."""
    artifact = manifest.artifacts.get(info.format)  # None: this export lacks the format
    if not info.sha256 or (artifact is not None and info.sha256 == artifact.sha256):
        return None
    served_at, export_at = _when(info.exported), _when(manifest.created)
    if served_at and export_at and served_at < export_at:
        older = "the served model is the older"
    elif served_at and export_at and served_at > export_at:
        older = "the export is the older"
    else:
        older = "which is older is not recorded"
    origin = _origin(info.exported, info.checkpoint_sha256)
    this = _origin(manifest.created, manifest.checkpoint.sha256)
    model = manifest.model.name
    published = _published_as(info, server)
    if published is not None:  # a restart serves that store's default again: no way out
        # Already a version (a rollback left it): roll it out, not a duplicate published.
        twin = versions.holding(model, export_dir, signing.store_of(published.dir))
        way = (
            f"`pipeline rollout --model {model} --version {twin.number}` (version "
            f"{twin.number} holds this export)"
            if twin is not None
            else "`pipeline publish` this export and `pipeline rollout` it"
        )
        return (
            f"The server answers {model} ({name}) from version {published.number} of its store "
            f"({published.dir}), not from {export_dir} ({older}; served: {origin}; this "
            f"export: {this}): check what it serves with --export-dir {published.dir}, or "
            f"{way}."
        )
    runtime = server.runtime if server is not None else runtime
    fix = f"`{runtimes.get(runtime or runtimes.default()).fix_command(model, server, export_dir)}`"
    return (
        f"The server answers {model} from another export than {export_dir} ({name}), and "
        f"{older} (served: {origin}; this export: {this}): run {fix} to serve this export "
        "(or, where the server serves a published version, `pipeline publish` this export "
        "and `pipeline rollout` it: a restart serves the store's default again)."
    )


def _published_as(info: ServedInfo, server: Server | None) -> versions.Version | None:
    """The store version whose artifact the server serves (by sha256), None when none is:
    the server's store (TorchServe records it), else the default store."""
    if server is None or not info.sha256:
        return None
    started = serve_options(server)
    # Started on an export folder: what it serves is that folder, even when the same bytes
    # were published since (a publish copies them), and a restart serves it again.
    if any(o.endswith("export-dir") or "export-dir=" in o for o in started):
        return None
    given = option_values(started, "--store")
    store = Path(server.extras.get("store") or (given[-1] if given else paths.DEFAULT_STORE))
    for version in reversed(versions.versions(info.model, store)):
        try:
            held = read_manifest(version.dir).artifacts.get(info.format)
        except PipelineError:
            continue
        if held is not None and held.sha256 == info.sha256:
            return version
    return None


def stale_of(
    served: dict[str, ServedInfo],
    manifest: Manifest,
    export_dir: Path,
    *,
    runtime: str | None = None,
    server: Server | None = None,
) -> str | None:
    """`stale` for several served names of one model: None when every one was built
    from this export, else one sentence naming all that were not (made together, they
    share their origin)."""
    old = [n for n, info in served.items() if stale(n, info, manifest, export_dir)]
    if not old:
        return None
    return stale(
        ", ".join(old), served[old[0]], manifest, export_dir, runtime=runtime, server=server
    )


def served_freshness(
    server: Server, name: str, artifacts_dir: Path | None = None
) -> tuple[bool | None, str]:
    """`freshness` of served `name` against its model's export under `artifacts_dir`
    (the default artifacts folder when None); (None, "") for one that records no model."""
    info = server.served.get(name)
    if info is None:
        return None, ""
    export_dir = paths.export_dir(info.model, artifacts_dir)
    return freshness(server.served, name, export_dir, server=server)


def freshness(
    served: dict[str, ServedInfo],
    name: str,
    export_dir: Path,
    runtime: str | None = None,
    manifest: Manifest | None = None,
    server: Server | None = None,
) -> tuple[bool | None, str]:
    """Whether served `name` (its record in `served`, as server.json keeps them) was
    built from the export in `export_dir`: (True, what matched), (False, the one-sentence
    diagnosis of `stale`), or (None, why they cannot be compared). `manifest`: the
    export's, when the caller has read it."""
    info = served.get(name)
    if info is None or not info.sha256:
        return None, f"{name} records no export to compare with (made by another tool)"
    if manifest is None:
        if not (Path(export_dir) / MANIFEST_NAME).is_file():
            return None, f"no export of {info.model} in {export_dir} to compare {name} with"
        try:
            manifest = read_manifest(Path(export_dir))
        except PipelineError as err:  # an unreadable export is reported, not raised
            return None, str(err)
    sentence = stale(name, info, manifest, Path(export_dir), runtime=runtime, server=server)
    if sentence:
        return False, sentence
    return True, (
        f"{name} serves the export in {export_dir} "
        f"({_origin(manifest.created, manifest.checkpoint.sha256)})"
    )


def choice_lines(server: Server, artifacts_dir: Path | None = None) -> list[str]:
    """One line per model served in one format: which format, and why that one (bench's
    fastest within the accuracy budget, or the registry's first). Models served in
    every format, or by served name, say so."""
    lines = []
    for model in sorted({info.model for info in server.served.values()}):
        mine = server.served_of(model)
        if len(mine) != 1:
            lines.append(f"{model}: {len(mine)} formats served ({', '.join(mine)}), as asked")
            continue
        name, info = next(iter(mine.items()))
        precision = registry.precision_of(info.format)
        why = _why_served(info, artifacts_dir)
        lines.append(f"{model}: serving {info.format} ({precision}) as {name}: {why}")
    return lines


def why_served(manifest: Manifest, fmt: str, fastest: dict[str, Any] | None) -> str:
    """Why `fmt` of this export is served: the default's reason, or that it was named."""
    default, why = choose(manifest, fastest)
    return why if default == fmt else f"chosen by name ({default} would be the default: {why})"


def _why_served(info: ServedInfo, artifacts_dir: Path | None) -> str:
    if info.why:  # said when it was chosen, the manifest at hand
        return info.why
    fastest = info.fastest or fastest_entry(info.model, None)
    export_dir = paths.export_dir(info.model, artifacts_dir)
    manifest = None
    if (export_dir / MANIFEST_NAME).is_file():
        try:
            manifest = read_manifest(export_dir)
        except PipelineError:
            manifest = None
    if manifest is not None and not stale("", info, manifest, export_dir):
        return why_served(manifest, info.format, fastest)
    if info.fastest and info.fastest.get("format") == info.format:
        return str(info.fastest.get("why") or "bench's fastest verified backend when archived")
    # Not a guess at why: it may have been named (`serve --models <archive>`), or archived
    # alone; the archive records no reason.
    return "as archived (no bench result or reason recorded with it)"
