"""`pipeline status`: the server running from a run folder and the versions it serves,
beside the versions the store holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from pipeline.core import paths, signing
from pipeline.serving import runtime, versions
from pipeline.serving.server import ServeError, Server

SAID = 3  # the error lines of an exited server's log that status prints
READY_TIMEOUT_S = 3.0  # a model's readiness answer: a hung server must not hang status


def _store_of(model: str, store: Path, trust: list[str]) -> dict[str, Any]:
    pointer = versions.read_pointer(model, store)
    held = versions.versions(model, store)
    policy = signing.Policy.load(store, trust)
    return {
        "versions": [v.number for v in held],
        "default": pointer.default,
        "history": pointer.history,
        # Each version's signature, checked against the store's policy (and --trust).
        "signatures": {str(v.number): signing.state(v.dir, policy).to_json() for v in held},
    }


def status(run_dir: Path, store: Path) -> dict[str, Any]:
    """What runs from `run_dir` and what `store` holds, as JSON-ready data."""
    out: dict[str, Any] = {"run_dir": str(run_dir), "server": None, "store": {}}
    try:
        server = Server.load(run_dir)
    except ServeError:
        server = None
    models: set[str] = set()
    if server is not None and not server.alive():  # it exited without `pipeline stop`
        out["exited"] = {
            "runtime": server.runtime,
            "pid": server.pid,
            "left": server.alive_pids(),  # its other processes (TorchServe's gateway)
            **last_words(run_dir),
        }
    elif server is not None:
        rt = runtime.of(server)
        state = rt.versions.live_state(server) if rt.versions else None
        stats = rt.versions.live_stats(server) if rt.versions else {}
        served = {}
        for name in server.models:
            info = server.served.get(name)
            entry: dict[str, Any] = {"model": info.model if info else None}
            if info:
                models.add(info.model)
            mv = state.models.get(name) if state else None
            if mv is not None:
                entry |= {
                    "versions": sorted(mv.versions),
                    "default": mv.default,
                    "canary": mv.canary,
                    "canary_percent": mv.percent if mv.canary is not None else 0.0,
                    "answers": {
                        str(v): {"requests": t.requests, "failed": t.failed, "p99_ms": t.p99_ms()}
                        for (n, v), t in sorted(stats.items())
                        if n == name
                    },
                }
            readiness = _readiness(server, rt, name)
            if readiness is not None:
                entry["ready"], entry["why"] = readiness
            served[name] = entry
        alive = server.alive_pids()
        out["server"] = {
            "runtime": rt.name,
            "pid": server.pid,
            "url": server.inference_url,
            "generation": state.generation if state else None,
            "models": served,
            # Its other processes that exited (TorchServe's gateway, which clients reach):
            # the main one alone running is no server to a client.
            "exited": {role: pid for role, pid in server.pids.items() if pid not in alive},
        }
    models |= stored_models(store, models)
    # The policy the server's workers check with: this command's --trust, else the keys
    # `serve --trust` gave the running server (status said "no trust policy" under one).
    trust = signing.given_keys() or (server.trust if server is not None else [])
    for model in sorted(models):
        held = _store_of(model, store, trust)
        if held["versions"]:
            out["store"][model] = held
    return out


def stored_models(store: Path, served: set[str]) -> set[str]:
    """The models `store` holds versions of that are not among `served` (a served model's
    folder is its name's slug, mine/clf.py:Clf → clf_Clf: it was listed twice)."""
    if not Path(store).is_dir():
        return set()
    slugs = {paths.model_slug(m) for m in served}
    return {
        folder.name
        for folder in Path(store).iterdir()
        if folder.is_dir()
        and folder.name not in slugs
        and ((folder / versions.POINTER).is_file() or any(versions.versions(folder.name, store)))
    }


def _readiness(server: Server, rt: Any, name: str) -> tuple[bool, str] | None:
    """(ready, why not) of served `name`, as the server's protocol answers it; None where
    it has no such route or the server does not offer it (404)."""
    from pipeline.serving.client import server_get

    path = rt.protocol.ready_path(name)
    if path is None:
        return None
    try:
        answer = server_get(server, server.inference_url + path, timeout=READY_TIMEOUT_S)
    except httpx.HTTPError as err:
        return False, f"no answer ({type(err).__name__})"
    if answer.status_code in (404, 405):
        return None
    try:
        body = answer.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    if answer.status_code == 200 and body.get("ready", True):
        return True, ""
    return False, str(body.get("error") or f"HTTP {answer.status_code}")


def last_words(run_dir: Path, tail_bytes: int = 65536) -> dict[str, Any]:
    """Why a server that exited on its own did: its newest log under `run_dir`/logs and
    the last (up to SAID) lines of it that report an error, else a warning, else its
    last lines."""
    logs = [p for p in (Path(run_dir) / "logs").glob("*") if p.is_file()]
    if not logs:
        return {}
    newest = max(logs, key=lambda p: p.stat().st_mtime)
    with newest.open("rb") as fh:
        fh.seek(max(0, newest.stat().st_size - tail_bytes))
        lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()]
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if " ERROR " in ln or ln.lower().startswith("error")]
    warnings = [ln for ln in lines if " WARNING " in ln or ln.lower().startswith("warning")]
    said = (errors or warnings or lines)[-SAID:]
    return {"log": str(newest), "lines": [ln[:400] for ln in said]}


def status_lines(found: dict[str, Any]) -> list[str]:
    lines = []
    server = found["server"]
    exited = found.get("exited")
    if exited is not None:
        lines.append(
            f"no server is running from {found['run_dir']}: the {exited['runtime']} server "
            f"(pid {exited['pid']}) exited without `pipeline stop`"
            + (f"; its log ({exited['log']}) ends:" if exited.get("log") else "")
        )
        lines += [f"  {line}" for line in exited.get("lines", [])]
        if exited.get("left"):
            pids = ", ".join(map(str, exited["left"]))
            lines.append(f"  still running from it: pid {pids} (`pipeline stop` ends them)")
    elif server is None:
        lines.append(f"no server is running from {found['run_dir']}")
    else:
        lines.append(f"{server['runtime']} (pid {server['pid']}) at {server['url']}")
        for role, pid in server.get("exited", {}).items():
            lines.append(
                f"  its {role} (pid {pid}) exited: requests to {server['url']} find no one; "
                "`pipeline stop`, then `pipeline serve` again"
            )
        for name, entry in server["models"].items():
            if "versions" not in entry:
                lines.append(
                    f"  {name}: one version (this runtime has no live versions){_ready_said(entry)}"
                )
                continue
            canary = (
                f", canary {entry['canary']} at {entry['canary_percent']:g}%"
                if entry["canary"] is not None
                else ""
            )
            lines.append(
                f"  {name}: versions {', '.join(map(str, entry['versions']))}; default "
                f"{entry['default']}{canary}{_ready_said(entry)}"
            )
    for model, held in found["store"].items():
        lines.append(
            f"store: {model} versions {', '.join(map(str, held['versions']))}; default "
            f"{held['default']}"
        )
        for number, signed in held.get("signatures", {}).items():
            lines.append(f"  version {number}: {signing.describe(signed)}")
    return lines


def troubled(found: dict[str, Any]) -> bool:
    """Whether `status` found something wrong (its exit status 1, for scripts): the server
    exited without `pipeline stop`, one of its processes did (TorchServe's gateway), or a
    served model is not ready. No server recorded is not: none was started, or it was
    stopped."""
    server = found["server"] or {}
    unready = [e for e in server.get("models", {}).values() if e.get("ready") is False]
    return found.get("exited") is not None or bool(unready) or bool(server.get("exited"))


def _ready_said(entry: dict[str, Any]) -> str:
    if "ready" not in entry:
        return ""
    return "; ready" if entry["ready"] else f"; NOT READY: {entry['why']}"
