"""Which running server verify checks, and its backends: the serving layer's side of
`pipeline verify` (the verify stage never imports serving; the CLI hands it these)."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.serving import backends, runtime
from pipeline.serving.served import StaleServerError
from pipeline.serving.server import ServeError, Server
from pipeline_runtime.manifest import Manifest

log = logging.getLogger(__name__)


def served_backends(
    asked: tuple[str, ...] | None,
    model: str,
    manifest: Manifest,
    run_dir: Path,
    export_dir: Path,
) -> list:
    """The served backends to check. `asked`: the --backend names (None: the default).

    A runtime named with --backend must be what runs from `run_dir` and must serve
    the model (ServeError otherwise). By default, the server that runs from `run_dir`
    is checked when it serves the model; when there is none, only the local backends are
    (a server that answers from another export is worth a warning)."""
    wanted = {n for n in asked or () if n in runtime.names()}
    if asked is not None and not wanted:
        return []
    try:
        server = Server.load(run_dir)
        rt = runtime.of(server)
        if wanted and rt.name not in wanted:
            names = " and ".join(sorted(wanted))
            raise ServeError(
                f"The server recorded in {server.run_dir} is {rt.title}, not {names}; start "
                f"one with `pipeline serve --runtime {sorted(wanted)[0]}`."
            )
        return backends.served_backends(model, manifest, server, export_dir)
    except PipelineError as err:
        if wanted:
            raise
        stale = isinstance(err, StaleServerError)
        log.log(logging.WARNING if stale else logging.INFO, "not checking a served model: %s", err)
        return []
