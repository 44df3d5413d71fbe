"""TorchServe's side of `pipeline rollout`: versions registered through its management API,
traffic moved by the gateway (versions.py).

A server started with `--live-versions` (TorchServe's model API on, loopback only, the
management key, archives from the store only: `allowed_urls`) can take a published
version: its archive is built into the store's `.rollout-archives/` as
`<archive>.v<N>.mar` (not into the version's folder, whose signature it would break; the
archive's own model version N; TorchServe copies a registered file into its store under
that name, which must not clash with the archive serving), registered beside the one
serving with as many workers, and only then routed to. A version taken out of service
is unregistered once the gateway says nothing runs on it any more.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import httpx

from pipeline.core.manifest import read_manifest
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.runtimes.torchserve.management import management
from pipeline.runtimes.torchserve.signed import to_rebuild
from pipeline.serving import live, versions
from pipeline.serving.server import Server

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 240.0


def live_state(server: Server) -> live.LiveState | None:
    """The run folder's state, else each served archive at the version TorchServe serves;
    None when the server was started without --live-versions."""
    if not server.extras.get("live_versions"):
        return None
    state = live.read(Path(server.run_dir))
    if state is not None:
        return state
    store = Path(server.extras["store"])
    models = {}
    for name in server.models:
        info = server.served.get(name)
        described = management(server, "GET", f"/models/{name}")
        number = str(described.json()[0].get("modelVersion", "")) if described.is_success else ""
        # An archive of a published version carries its number; any other is no version
        # of the store's (rollout refuses it: its export_dir is none of the store's).
        where = ""
        if info is not None and number.isdigit():
            found = [v for v in versions.versions(info.model, store) if v.number == int(number)]
            where = str(found[0].dir) if found else ""
        n = int(number) if number.isdigit() else 1
        loaded = live.Loaded(n, where, info.format if info else "")
        models[name] = live.ModelVersions({n: loaded}, n)
    return live.LiveState(0, models)


def initial_state(server: Server) -> live.LiveState:
    """What a server started with --live-versions serves, as the gateway's first state
    (the gateway then names the answering version from the first request; it named none
    until a rollout). Every archive is in it, so a rollout still says of one that is no
    version of the store that it is served from an export folder; the gateway leaves
    those to TorchServe's own routing (versions.Router.route)."""
    return live_state(server) or live.LiveState(0, {})


def _workers(server: Server, name: str, version: int) -> int:
    described = management(server, "GET", f"/models/{name}/{version}")
    return max(1, len(described.json()[0].get("workers", []))) if described.is_success else 1


# Where a rollout builds a version's archive: in the store (allowed_urls), outside the
# version's folder, whose signature would count it as a file added after signing.
ARCHIVES = ".rollout-archives"


def rollout_archive(name: str, where: live.Loaded, store: Path) -> Path:
    """The version's archive (built once), named apart from the serving one. Under a trust
    policy a kept one must still be what archiving the signed version gives."""
    version_dir = Path(where.export_dir)
    target = Path(store) / ARCHIVES / f"{name}.v{where.version}.mar"
    # A kept one is used only while it still holds the version's bytes and this
    # installation's code, with or without a trust policy: the policy the rollout checked
    # with may be the server's (`serve --trust`), which the store does not know of.
    if target.is_file() and not to_rebuild(target, version_dir, where.format, where.version):
        return target
    target.parent.mkdir(exist_ok=True)
    manifest = read_manifest(version_dir)
    with tempfile.TemporaryDirectory(prefix=".archive-", dir=store) as tmp:
        (built,) = archive(
            ArchiveConfig(
                model=manifest.model.name,
                export_dir=Path(where.export_dir),
                store=Path(tmp),
                formats=(where.format,),
                version=str(where.version),
                bench_results=None,
            ),
            manifest,
        )
        if built.stem != name:
            raise live.LiveError(f"{where.export_dir} archives as {built.stem}, not {name}.")
        built.replace(target)
    return target


def apply_live(server: Server, state: live.LiveState, timeout_s: float) -> None:
    now = live_state(server)
    if now is None:
        raise live.LiveError("TorchServe was started without --live-versions.")
    store = Path(server.extras["store"]).resolve()
    for name, mv in state.models.items():
        have = now.models.get(name)
        workers = _workers(server, name, have.default) if have else 1
        for number, where in sorted(mv.versions.items()):
            if have and number in have.versions:
                continue
            mar = rollout_archive(name, where, store)
            # TorchServe copies a registered file into its store and refuses a name already
            # there ("Model file already exists"): a copy an earlier server kept (the version
            # promoted, then the server stopped) is not registered now, so it goes.
            (store / mar.name).unlink(missing_ok=True)
            answer = management(
                server,
                "POST",
                "/models",
                timeout=REGISTER_TIMEOUT_S,
                params={
                    "url": f"file://{mar.resolve()}",
                    "initial_workers": workers,
                    "synchronous": "true",
                },
            )
            if not answer.is_success:
                raise live.LiveError(
                    f"TorchServe did not register {name} version {number}: "
                    f"{answer.status_code} {answer.text[:300]}"
                )
            # The archive's model-config.yaml (minWorkers/maxWorkers 1) caps initial_workers:
            # scaled as `serve` scales the default, or a canary ran on one worker of its two.
            try:  # registered already: a failed scale is a warning, never a half rollout
                scaled = management(
                    server,
                    "PUT",
                    f"/models/{name}/{number}",
                    timeout=REGISTER_TIMEOUT_S,
                    params={"min_worker": workers, "max_worker": workers, "synchronous": "true"},
                )
                why = None if scaled.is_success else scaled.text[:200]
            except httpx.HTTPError as err:
                why = f"{type(err).__name__}: {err}"
            if why is not None:
                log.warning(
                    "%s version %d runs on fewer workers than the default's %d: %s",
                    name,
                    number,
                    workers,
                    why,
                )
    run_dir = Path(server.run_dir)
    live.write(run_dir, state)
    live.wait_applied(run_dir, state.generation, 1, timeout_s)  # the gateway: drained too
    for name, mv in state.models.items():
        management(server, "PUT", f"/models/{name}/{mv.default}/set-default")
        gone = set(now.models[name].versions) - set(mv.versions) if name in now.models else set()
        for number in sorted(gone):
            answer = management(server, "DELETE", f"/models/{name}/{number}", timeout=60)
            if not answer.is_success:
                raise live.LiveError(
                    f"TorchServe did not unregister {name} version {number}: "
                    f"{answer.status_code} {answer.text[:300]}"
                )
