"""`pipeline rollout` and `pipeline rollback`: move a running server between published
versions without a restart, and only after the new version answered right through it.

A rollout (the KServe runtime's, or any runtime with the versions capability):

1. loads the version beside the one serving, on every worker; nothing routes to it;
2. checks it through the live server by its own versioned route against its golden I/O
   and probes (verify's served-parity check): a failure unloads it and refuses the rollout;
3. moves traffic: all of it (the store's default pointer moves too), or with `--canary
   PCT` that share of unversioned requests, watched for `--watch` seconds: an error rate
   or p99 beyond the bounds rolls the canary back by itself. `--promote` later moves the
   rest (the bounds are judged once more first); `pipeline rollback` undoes either.
A version taken out of service is dropped only once its in-flight requests finish."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from pipeline.core import paths, signing
from pipeline.core.errors import PipelineError
from pipeline.core.manifest import read_manifest
from pipeline.serving import backends, live, runtime, versions
from pipeline.serving.capabilities import Versions
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.rolloutconfig import Bounds as Bounds  # re-exported: callers import it here
from pipeline.serving.rolloutconfig import RolloutConfig, judge
from pipeline.serving.server import ServeError, Server, restart_command, run_dir_flag, store_flag

Say = Callable[[str], None]


class RolloutRefusedError(PipelineError):
    """The new version did not pass (or could not be loaded): the old one keeps serving."""


class RolledBackError(PipelineError):
    """The canary broke a bound while watched and was taken out of service."""


@contextlib.contextmanager
def _exclusive(run_dir: Path) -> Iterator[None]:
    """One rollout or rollback at a time per server."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".rollout.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PipelineError(f"Another rollout or rollback is running on {run_dir}.") from None
        yield


def running(run_dir: Path) -> tuple[Server, runtime.Runtime, live.LiveState]:
    """The server `pipeline serve` started from `run_dir`, its runtime and live state."""
    try:
        server = Server.load(run_dir)
    except (ServeError, FileNotFoundError):
        server = None
    if server is None or not server.alive():
        raise ServeError(f"No server is running from {run_dir}; start one with `pipeline serve`.")
    rt = runtime.of(server)
    state = rt.versions.live_state(server) if rt.versions else None
    if state is None and rt.versions is not None:  # it can, started so: say how
        flag = "--live-versions"  # (a server without a recorded command: the bare command)
        again = restart_command(server, f"pipeline serve {flag}", adding=[flag])
        said = f"{rt.title} changes versions while it serves when started with {flag}"
        raise PipelineError(f"{said}; this one was not. Restart it so: `{again}`")
    if state is None:
        raise PipelineError(
            f"{rt.title} cannot change versions while it serves; restart it with `pipeline "
            "serve` (it serves the store's default version) or use a runtime that can."
        )
    return server, rt, state


def _versions(rt: runtime.Runtime) -> Versions:
    """The versions capability of a runtime `running` accepted."""
    if rt.versions is None:
        raise PipelineError(f"{rt.title} cannot change versions while it serves.")
    return rt.versions


def served_names(server: Server, state: live.LiveState, model: str) -> list[str]:
    """The served names under which `server` answers for `model` (one per format)."""
    names = [
        n
        for n in state.models
        if (info := server.served.get(n)) is not None and info.model == model
    ]
    if not names:
        raise PipelineError(
            f"The server in {server.run_dir} does not serve {model}; it serves "
            f"{', '.join(state.models) or 'nothing'}."
        )
    return names


def _next(
    state: live.LiveState,
    names: list[str],
    change: Callable[[live.ModelVersions], live.ModelVersions],
) -> live.LiveState:
    models = dict(state.models)
    for n in names:
        models[n] = change(models[n])
    return live.LiveState(state.generation + 1, models)


def _serving(state: live.LiveState, name: str) -> str:
    return state.models[name].versions[state.models[name].default].export_dir


def _without(mv: live.ModelVersions, number: int) -> live.ModelVersions:
    kept = {k: v for k, v in mv.versions.items() if k != number}
    return replace(mv, versions=kept, canary=None, percent=0.0)


def rollout(config: RolloutConfig, say: Say = print) -> live.LiveState:
    """See the module doc. Returns the state the server serves when it is done."""
    config.validate()
    with _exclusive(Path(config.run_dir)):
        server, rt, state = running(Path(config.run_dir))
        names = served_names(server, state, config.model)
        versions.refuse_other_store(_serving(state, names[0]), config.store)
        if config.promote:
            return _promote(config, rt, server, state, names, say)
        version = versions.get(config.model, int(config.version or 0), config.store)
        _trusted(version.dir, server)
        for n in names:
            if versions.number_of(Path(_serving(state, n))) is None:
                raise RolloutRefusedError(
                    f"{n} is served from an export folder, not a published version: publish "
                    f"it (`pipeline publish --model {config.model}`) and restart the server "
                    "once, so the store's default is what it serves."
                )
            if state.models[n].canary is not None:
                raise RolloutRefusedError(
                    f"{n} has a canary (version {state.models[n].canary}): promote it "
                    "(`pipeline rollout --promote`) or roll it back first."
                )
        if all(state.models[n].default == version.number for n in names):
            say(f"{config.model} version {version.number} is already the default.")
            return state
        held = set(version.provenance().get("formats", []))
        for n in names:
            fmt = state.models[n].versions[state.models[n].default].format
            if fmt not in held:
                raise RolloutRefusedError(
                    f"Version {version.number} has no {fmt} artifact, which {n} serves; it "
                    f"holds {', '.join(sorted(held)) or 'none'}."
                )

        def beside(mv: live.ModelVersions) -> live.ModelVersions:
            fmt = mv.versions[mv.default].format
            new = live.Loaded(version.number, str(version.dir), fmt)
            return replace(mv, versions={**mv.versions, version.number: new})

        staged = _next(state, names, beside)
        say(f"loading {config.model} version {version.number} beside the default on every worker")
        try:
            _versions(rt).apply_live(server, staged, config.timeout_s)
        except live.LiveError as err:
            _restore(rt, server, staged, state, config.timeout_s)
            raise RolloutRefusedError(f"Version {version.number} did not load: {err}") from None
        say(f"checking version {version.number} through the live server (golden I/O, probes)")
        try:
            problem = live_check(server, rt, version, names, Path(config.run_dir))
        except BaseException:  # the check could not run (its export unreadable, ^C): unload
            _restore(rt, server, staged, state, config.timeout_s)
            raise
        if problem:
            _restore(rt, server, staged, state, config.timeout_s)
            raise RolloutRefusedError(
                f"Version {version.number} failed the live check; the default "
                f"(version {state.models[names[0]].default}) keeps serving.\n{problem}"
            )
        if config.canary is not None:
            pct = float(config.canary)
            canary = _next(
                staged, names, lambda mv: replace(mv, canary=version.number, percent=pct)
            )
            _versions(rt).apply_live(server, canary, config.timeout_s)
            say(f"canary: {pct:g}% of unversioned requests go to version {version.number}")
            return _watch(config, rt, server, canary, names, version.number, say)
        final = _next(staged, names, lambda mv: _only(mv, version.number))
        _versions(rt).apply_live(server, final, config.timeout_s)
        versions.set_default(config.model, version.number, config.store)
        _record_default(server, names, version)
        say(f"{config.model} version {version.number} is the default; the old one is unloaded")
        return final


def _trusted(version_dir: Path, server: Server) -> None:
    """Check `version_dir` as `server`'s workers will load it (signing.recheck), with this
    command's --trust, which may add no key the server lacks (its workers would refuse)."""
    store = signing.store_of(version_dir)
    if signing.is_version(version_dir) and (
        beyond := signing.unheld(signing.given_keys(), server.trust, store, server.pins)
    ):
        raise RolloutRefusedError(
            f"--trust {' '.join(beyond)}: the running server's workers check versions against "
            + (
                "the keys `pipeline serve --trust` gave it, not this command's; restart "
                "`pipeline serve` with it."
                if server.trust
                else "the keys its store's trust/ held as `pipeline serve` started, not this "
                "command's; restart `pipeline serve` with it in trust/."
                if str(store) in server.pins
                else "the store's trust/ folder (read at every load), not this command's: add "
                "the key there."
            )
        )
    signing.require(version_dir, server.trust, server.pins)


def _record_default(server: Server, names: list[str], version: versions.Version) -> None:
    """server.json's record of what each served name answers with by default, once the
    default changed: what `infer` and verify compare a local export with (it kept the
    first version's, so after a rollout `infer` called the export just published stale)."""
    manifest = read_manifest(version.dir)
    served = dict(server.served)
    for n in names:
        old = served[n]
        served[n] = ServedInfo.of(manifest, old.format, old.fastest, old.why)
    replace(server, served=served).record()


def _only(mv: live.ModelVersions, number: int) -> live.ModelVersions:
    return live.ModelVersions({number: mv.versions[number]}, number)


def _restore(
    rt: runtime.Runtime, server: Server, now: live.LiveState, back: live.LiveState, timeout_s: float
) -> None:
    """Back to `back`'s versions and split, as a newer generation than `now`."""
    _versions(rt).apply_live(server, replace(back, generation=now.generation + 1), timeout_s)


def live_check(
    server: Server, rt: runtime.Runtime, version: versions.Version, names: list[str], run_dir: Path
) -> str | None:
    """`version` through the live server by its own route, against its own golden I/O and
    probes: None when it passes, else verify's failure message."""
    from pipeline.verify import VerifyConfig, verify

    exported = version.open()
    checked = [
        b
        for n in names
        for b in backends.version_backends(server, n, version.number, exported.manifest)
    ]
    report = verify(
        VerifyConfig(
            model=version.model,
            export_dir=version.dir,
            checkpoint=version.checkpoint,
            backends=(rt.name,),
            served_names=(rt.name,),
            page=False,
            report=run_dir
            / live.FOLDER
            / f"check-{paths.model_slug(version.model)}-{version.number}.json",
        ),
        served=checked,
        exported=exported,
    )
    return None if report.passed else report.failure_message()


def _watch(
    config: RolloutConfig,
    rt: runtime.Runtime,
    server: Server,
    state: live.LiveState,
    names: list[str],
    number: int,
    say: Say,
) -> live.LiveState:
    default = state.models[names[0]].default
    deadline = time.monotonic() + config.watch_s
    # The hints below carry this rollout's folders: copied without them, they would act on
    # the default run folder's server and store.
    flags = run_dir_flag(config.run_dir) + store_flag(config.store)
    while True:
        why, summary, unjudged = judge(
            _versions(rt).live_stats(server), names, number, default, config.bounds
        )
        if why:
            back = _next(state, names, lambda mv: _without(mv, number))
            _versions(rt).apply_live(server, back, config.timeout_s)
            raise RolledBackError(
                f"Rolled the canary back: {why}. Version {default} serves all traffic."
            )
        if time.monotonic() >= deadline:
            say(f"watched {config.watch_s:g} s: {summary}")
            if unjudged:  # 0 answers is no pass: --promote refuses until it has enough
                say(f"not judged yet: {unjudged}; send traffic to it before promoting")
            say(
                f"promote with `pipeline rollout --model {config.model} --promote{flags}`, or "
                f"undo with `pipeline rollback --model {config.model}{flags}`"
            )
            return state
        time.sleep(0.25)


def _promote(
    config: RolloutConfig,
    rt: runtime.Runtime,
    server: Server,
    state: live.LiveState,
    names: list[str],
    say: Say,
) -> live.LiveState:
    canaries = {state.models[n].canary for n in names}
    if None in canaries or len(canaries) != 1:
        raise PipelineError(f"{config.model} has no canary to promote; start one with --canary.")
    (number,) = canaries
    stats = _versions(rt).live_stats(server)
    default = state.models[names[0]].default
    why, summary, unjudged = judge(stats, names, number, default, config.bounds)
    if unjudged and not why:
        raise PipelineError(
            f"Not promoted: {unjudged}, so it has not been judged ({summary}). Send traffic "
            "to it and --promote again, or promote it unjudged with --min-requests 0."
        )
    if why:
        _versions(rt).apply_live(
            server, _next(state, names, lambda mv: _without(mv, number)), config.timeout_s
        )
        raise RolledBackError(f"Not promoted, rolled the canary back: {why}.")
    final = _next(state, names, lambda mv: _only(mv, number))
    _versions(rt).apply_live(server, final, config.timeout_s)
    versions.set_default(config.model, number, config.store)
    _record_default(server, names, versions.get(config.model, number, config.store))
    say(f"promoted: {config.model} version {number} is the default ({summary})")
    return final


def rollback(
    model: str,
    run_dir: Path,
    store: Path = paths.DEFAULT_STORE,
    say: Say = print,
    timeout_s: float = 180.0,
) -> int:
    """Undo the last step: a canary is taken out; else the previous default comes back
    (loaded beside, then all traffic, then the current one unloaded) and the store's
    pointer moves back. With no server running, only the pointer moves. Returns the
    version that is the default afterwards."""
    with _exclusive(Path(run_dir)):
        try:
            server, rt, state = running(Path(run_dir))
        except ServeError:
            # The version the next `serve` will load: refused now, not then.
            signing.require(versions.get(model, versions.previous(model, store), store).dir)
            pointer = versions.roll_back_pointer(model, store)
            say(
                f"no server is running: the store's default for {model} is now version "
                f"{pointer.default} (served from the next `pipeline serve`)"
            )
            return int(pointer.default or 0)
        names = served_names(server, state, model)
        versions.refuse_other_store(_serving(state, names[0]), store)
        canary = state.models[names[0]].canary
        if canary is not None:
            _versions(rt).apply_live(
                server, _next(state, names, lambda mv: _without(mv, canary)), timeout_s
            )
            default = state.models[names[0]].default
            say(f"canary version {canary} removed; version {default} serves all traffic")
            return default
        back = versions.get(model, versions.previous(model, store), store)
        _trusted(back.dir, server)

        def beside(mv: live.ModelVersions) -> live.ModelVersions:
            old = live.Loaded(back.number, str(back.dir), mv.versions[mv.default].format)
            return replace(mv, versions={**mv.versions, back.number: old})

        staged = _next(state, names, beside)
        try:
            _versions(rt).apply_live(server, staged, timeout_s)
        except live.LiveError as err:
            # As a rollout does: the live state must not keep a version no worker holds,
            # or the next worker the supervisor restarts would load it and fail.
            _restore(rt, server, staged, state, timeout_s)
            raise RolloutRefusedError(
                f"Version {back.number} did not load, so nothing was rolled back; version "
                f"{state.models[names[0]].default} keeps serving: {err}"
            ) from None
        _versions(rt).apply_live(
            server, _next(staged, names, lambda mv: _only(mv, back.number)), timeout_s
        )
        versions.roll_back_pointer(model, store)
        _record_default(server, names, back)
        say(f"rolled back: {model} version {back.number} is the default again")
        return back.number
