"""The KServe runtime's side of `pipeline rollout`: its live state lives in the run folder
(pipeline.serving.live), which every worker watches and acknowledges."""

from __future__ import annotations

from pathlib import Path

from pipeline.runtimes.kserve.config import RuntimeConfig, ServedExport
from pipeline.runtimes.kserve.constants import CONFIG_FILE
from pipeline.serving import live
from pipeline.serving.server import Server


def _config(server: Server) -> RuntimeConfig:
    return RuntimeConfig.read(Path(server.run_dir) / CONFIG_FILE)


def live_state(server: Server) -> live.LiveState:
    """The run folder's state, or, before any rollout, what the runtime started with."""
    state = live.read(Path(server.run_dir))
    if state is not None:
        return state
    models = {}
    for m in _config(server).models:
        number = m.version or 1
        loaded = live.Loaded(number, m.export_dir, m.format)
        models[m.name] = live.ModelVersions({number: loaded}, number)
    return live.LiveState(0, models)


def apply_live(server: Server, state: live.LiveState, timeout_s: float) -> None:
    run_dir = Path(server.run_dir)
    live.write(run_dir, state)
    live.wait_applied(run_dir, state.generation, _config(server).workers, timeout_s)


def initial(
    models: list[ServedExport], state: live.LiveState | None
) -> dict[str, tuple[live.ModelVersions, list[ServedExport]]]:
    """What each served name starts with: the live state's versions when the run folder
    has one (a worker the supervisor restarted), else the configured export as its only
    version."""
    out = {}
    for served in models:
        wanted = state.models.get(served.name) if state else None
        if wanted is None:
            number = served.version or 1
            loaded = live.Loaded(number, served.export_dir, served.format)
            wanted = live.ModelVersions({number: loaded}, number)
        out[served.name] = (
            wanted,
            [
                ServedExport(served.name, v.export_dir, v.format, version=v.version)
                for v in wanted.versions.values()
            ],
        )
    return out
