"""verify's served backends, built from what a server recorded and the protocol it speaks.

One backend per served model of the export and per transport of the runtime's protocol
(`Protocol.transports`): `<runtime>/<format>` when the protocol has one transport
(TorchServe's REST, the toy's), `<runtime>/<transport>/<format>` when it has several
(the KServe runtime's `kserve/rest/onnx` and `kserve/grpc/onnx`). A backend's `run`
sends the named inputs with the inference token (`Protocol.infer`) and returns the
outputs in the manifest's order and dtypes. No runtime writes a backend of its own:
the CLI hands these to `verify(config, served=...)`, and rollout's live check reaches
a version by its own route (`version_backends`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.serving import runtime, served
from pipeline.serving.server import ServeError, Server, restart_command

if TYPE_CHECKING:
    import torch

    from pipeline_runtime.manifest import Manifest


class ServedBackend:
    """One served model (a version of it, when `version` is given) over one transport."""

    in_process = False

    def __init__(
        self,
        server: Server,
        served_name: str,
        fmt: str,
        manifest: Manifest,
        transport: str | None = None,
        version: int | None = None,
    ) -> None:
        self.server, self.served_name, self.format_key = server, served_name, fmt
        self.protocol = runtime.of(server).protocol
        self.transport = transport or self.protocol.transports[0]
        self.version = None if version is None else str(version)  # None: the unversioned route
        via = f"{self.transport}/" if len(self.protocol.transports) > 1 else ""
        at = "" if version is None else f"@{version}"
        self.name = f"{server.runtime}/{via}{fmt}{at}"
        self.outputs = manifest.outputs

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The outputs the server answered, by name (verify reports any it left out)."""
        import torch

        got = self.protocol.infer(
            self.server, self.served_name, inputs, version=self.version, transport=self.transport
        )
        return {
            o.name: got[o.name].to(getattr(torch, o.dtype)) for o in self.outputs if o.name in got
        }


def served_backends(
    model: str, manifest: Manifest, server: Server, export_dir: Path | None = None
) -> list[ServedBackend]:
    """A backend per transport for each model `server` serves from this export, in the
    order it recorded them. ServeError when it is not running or serves none of the
    model; StaleServerError, saying which is older and what to run, when what it loaded at
    start (its record, not the export folder as it is now) came from another export."""
    rt = runtime.of(server)
    title = rt.title[:1].upper() + rt.title[1:]  # "the KServe runtime" opens a sentence
    if not server.alive():
        raise ServeError(
            f"{title} recorded in {server.run_dir} is not running; "
            f"start it with `{restart_command(server, f'pipeline serve --runtime {rt.name}')}`."
        )
    mine = server.served_of(manifest.model.name)
    where = Path(export_dir) if export_dir else Path(f"the export of {model}")
    stale = served.stale_of(mine, manifest, where, server=server)
    if stale:
        raise served.StaleServerError(stale)
    if not mine:
        raise ServeError(
            f"{title} in {server.run_dir} does not serve {model}; "
            f"serve it with `{rt.fix_command(model, server)}`."
        )
    return [
        ServedBackend(server, name, info.format, manifest, transport)
        for name, info in mine.items()
        for transport in rt.protocol.transports
    ]


def version_backends(
    server: Server, served_name: str, version: int, manifest: Manifest
) -> list[ServedBackend]:
    """Backends that reach `version` of `served_name` by its versioned route, one per
    transport (rollout's live check against that version's own golden I/O and probes)."""
    rt = runtime.of(server)
    state = rt.versions.live_state(server) if rt.versions else None
    if state is None:
        raise ServeError(f"{rt.title} serves no versions of {served_name}")
    fmt = state.models[served_name].versions[version].format
    return [
        ServedBackend(server, served_name, fmt, manifest, transport, version)
        for transport in rt.protocol.transports
    ]
