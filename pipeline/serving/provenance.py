"""What a server serves of a model, and where it came from (runtime-neutral).

`ServedInfo` is one served model's provenance: which model and format, the
artifact's and the checkpoint's sha256, when it was exported and, when
`pipeline bench` measured the model, its fastest verified backend. Every runtime
records it per served name in `server.json` (TorchServe's archives also carry it
inside, pipeline.runtimes.torchserve.store.read_info), so clients find a model's
served name by model and format and `served.stale` can tell a stale server from a
wrong one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.core import paths
from pipeline_runtime.manifest import Manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedInfo:
    """What a served name holds and where it came from, for serve and the client."""

    model: str  # as the export names it: "digits_lenet", "torchvision:resnet18"
    format: str  # registry key
    sha256: str = ""  # the artifact's, so a served archive can be matched with its export
    fastest: dict[str, Any] | None = None  # the model's entry in bench's fastest.json
    # The export it was built from (manifest `checkpoint.sha256` and `created`), so a
    # stale server can be told apart from a wrong one (serving.served.stale).
    checkpoint_sha256: str = ""
    exported: str = ""
    # Why this format is served (served.why_served), said where the choice was made with
    # the manifest at hand, so `pipeline serve` need not read it again to say so.
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> ServedInfo:
        if not isinstance(data, dict) or not {"model", "format"} <= set(data):
            raise ValueError(f"not a served model's record: {data!r}")
        fastest = data.get("fastest")
        return cls(
            model=str(data["model"]),
            format=str(data["format"]),
            sha256=str(data.get("sha256", "")),
            fastest=dict(fastest) if isinstance(fastest, dict) else None,
            checkpoint_sha256=str(data.get("checkpoint_sha256", "")),
            exported=str(data.get("exported", "")),
            why=str(data.get("why", "")),
        )

    @classmethod
    def of(
        cls, manifest: Manifest, fmt: str, fastest: dict[str, Any] | None = None, why: str = ""
    ) -> ServedInfo:
        """The record of `manifest`'s `fmt` artifact."""
        return cls(
            model=manifest.model.name,
            format=fmt,
            sha256=manifest.artifact(fmt).sha256,
            fastest=fastest,
            checkpoint_sha256=manifest.checkpoint.sha256,
            exported=manifest.created,
            why=why,
        )


def default_bench_results(artifacts_dir: Path | None = None) -> Path | None:
    """<artifacts>/bench/fastest.json when `pipeline bench` wrote one, else None."""
    path = paths.fastest_path(artifacts_dir)
    return path if path.is_file() else None


def fastest_entry(model: str, bench_results: Path | None) -> dict[str, Any] | None:
    """`model`'s entry in bench's fastest.json (the default file when None), if any."""
    path = Path(bench_results) if bench_results else default_bench_results()
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        log.warning("%s cannot be read (%s); archiving without a fastest backend", path, err)
        return None
    entry = data.get(model) if isinstance(data, dict) else None
    return dict(entry) if isinstance(entry, dict) and entry.get("format") else None
