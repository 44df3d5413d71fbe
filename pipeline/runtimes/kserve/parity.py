"""The KServe runtime's backends for verify: each served model over REST and over gRPC.

`kserve_backends(model, manifest, server)` returns two backends per model the
runtime `server` serves from this export, `kserve/rest/<format>` and
`kserve/grpc/<format>`. Both speak the Open Inference Protocol with the
inference token; REST sends JSON tensors, gRPC sends raw little-endian bytes
(`raw_input_contents`), so the two paths decode differently and each is
checked on its own. Outputs come back by name, in the manifest's dtypes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.core.manifest import read_manifest
from pipeline.runtimes.kserve.config import CONFIG_FILE, RuntimeConfig, ServedExport
from pipeline.runtimes.kserve.constants import NAME
from pipeline.serving import served as served_mod
from pipeline.serving.openinference import OIP
from pipeline.serving.server import ServeError, Server
from pipeline_runtime.manifest import Manifest


class KServeBackend:
    """One model served by the KServe runtime, reached over REST or gRPC."""

    in_process = False

    def __init__(
        self,
        server: Server,
        served_name: str,
        fmt: str,
        manifest: Manifest,
        transport: str,
        version: int | None = None,
    ) -> None:
        self.server, self.served_name, self.transport = server, served_name, transport
        self.version = None if version is None else str(version)  # None: the unversioned route
        at = "" if version is None else f"@{version}"
        self.name = f"{NAME}/{transport}/{fmt}{at}"
        self.format_key = fmt
        self.outputs = manifest.outputs

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        got = self._rest(inputs) if self.transport == "rest" else self._grpc(inputs)
        return {
            o.name: got[o.name].to(getattr(torch, o.dtype)) for o in self.outputs if o.name in got
        }

    def _rest(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return OIP.infer(self.server, self.served_name, inputs, version=self.version)

    def _grpc(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return OIP.infer_grpc(
            self.server, self.served_name, inputs, self.server.extras["grpc_url"],
            version=self.version,
        )  # fmt: skip


def _model_of(served: ServedExport, server: Server) -> str:
    """The model `served` holds, from what the runtime recorded at start (its export is
    read only for a record without it)."""
    info = server.archives.get(served.name)
    return info.model if info is not None else read_manifest(Path(served.export_dir)).model.name


def kserve_backends(model: str, manifest: Manifest, server: Server) -> list[KServeBackend]:
    """REST and gRPC backends for every model the KServe runtime `server` serves from this
    export. ServeError when it is not running or serves none."""
    if not server.alive():
        raise ServeError(
            f"The KServe runtime recorded in {server.run_dir} is not running; start it with "
            "`pipeline serve --runtime kserve`."
        )
    config = RuntimeConfig.read(Path(server.run_dir) / CONFIG_FILE)
    served = [m for m in config.models if _model_of(m, server) == manifest.model.name]
    if not served:
        raise ServeError(
            f"The KServe runtime in {server.run_dir} does not serve {model}; restart it with "
            f"`pipeline serve --runtime kserve --model {model}`."
        )
    # What the runtime loaded at start (server.json), not the export folder as it is now:
    # an export rewritten since is on disk but not in the runtime.
    loaded = {m.name: server.archives[m.name] for m in served if m.name in server.archives}
    stale = served_mod.stale_of(loaded, manifest, Path(served[0].export_dir), runtime=NAME)
    if stale:
        raise ServeError(stale)
    return [
        KServeBackend(server, m.name, m.format, manifest, transport)
        for m in served
        for transport in ("rest", "grpc")
    ]
