"""Served backends for verify: each archive of a model that a running server serves.

`served_backends(model, manifest, run_dir)` returns one backend per served
format, named `torchserve/<format key>`, whose `run(inputs)` sends the named
inputs over REST (through the client, with the token) and returns the outputs
in the manifest's order and dtypes. The CLI hands them to
`verify(config, served=...)`: verify compares them with eager like the
in-process backends and never imports the serving stage.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.runtimes.torchserve.constants import NAME
from pipeline.runtimes.torchserve.protocol import PROTOCOL
from pipeline.serving import served as served_mod
from pipeline.serving.served import StaleServerError
from pipeline.serving.server import ServeError, Server
from pipeline_runtime.manifest import Manifest


class ServedBackend:
    """One served archive, reached over REST with the inference token."""

    in_process = False

    def __init__(
        self, server: Server, archive: str, fmt: str, manifest: Manifest, version: int | None = None
    ) -> None:
        self.server = server
        self.archive = archive
        self.version = None if version is None else str(version)  # None: the default route
        self.name = f"{NAME}/{fmt}" + ("" if version is None else f"@{version}")
        self.format_key = fmt
        self.outputs = manifest.outputs

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The outputs the server answered, by name (verify reports any it left out)."""
        answer = PROTOCOL.infer(self.server, self.archive, inputs, version=self.version)
        return {
            o.name: answer[o.name].to(getattr(torch, o.dtype))
            for o in self.outputs
            if o.name in answer
        }


def served_backends(
    model: str, manifest: Manifest, server: Server, export_dir: Path | None = None
) -> list[ServedBackend]:
    """One backend per archive of `model` that TorchServe `server` serves, in registry
    order (TorchScript first). ServeError when it is not running or serves no archive of
    the model; StaleServerError, saying which is older and what to run, when it serves one
    built from another export than `manifest` (the one in `export_dir`)."""
    if not server.alive():
        raise ServeError(
            f"The server recorded in {server.run_dir} is not running; start it with `pipeline serve`."
        )
    served = server.archives_of(model)
    where = Path(export_dir) if export_dir else Path(f"the export of {model}")
    stale = served_mod.stale_of(served, manifest, where, runtime=server.runtime)
    if stale:
        raise StaleServerError(stale)
    found = [ServedBackend(server, name, info.format, manifest) for name, info in served.items()]
    if not found:
        raise ServeError(
            f"The running server does not serve {model}; archive it (`pipeline archive --model {model}`) "
            "and restart the server."
        )
    return found
