"""`open_export(dir)`: an export folder as one object, for every stage after export.

Verify, bench, loadtest and serve all start from an export: its typed
manifest, the eager reference (the zoo entry holding the checkpoint the
export came from), the golden and probe inputs export stored, and each
artifact loaded as a Runner through the format registry. Before this, each
of them opened an export its own way.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipeline.core.checkpoint import load_checkpoint, sidecar_path
from pipeline.core.errors import ArtifactError
from pipeline.core.manifest import GOLDEN_KEY, PROBES_KEY, Manifest, artifact_path, read_manifest
from pipeline.formats import base as registry
from pipeline.zoo import get_entry
from pipeline.zoo.spec import Inputs, ZooEntry
from pipeline.zoo.user import entry_from_manifest
from pipeline_runtime.outputs import name_outputs
from pipeline_runtime.runners import LoadError, Runner


@dataclass
class ExportedModel:
    """An export folder, opened: the manifest, the eager reference and the artifacts."""

    dir: Path
    manifest: Manifest
    entry: ZooEntry
    model: torch.nn.Module  # eager, eval mode, the export's checkpoint loaded
    checkpoint: Path
    _tensors: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.manifest.model.name

    @property
    def failed(self) -> dict[str, str]:
        """Formats the export was asked for but could not write (key → why)."""
        return self.manifest.failed

    def path(self, key: str) -> Path:
        """Artifact `key`'s file, after its sha256 check (one export judged outside its
        budget included: verify checks it again, and fails it)."""
        if key in self.manifest.unwritten:
            raise ArtifactError(
                f"{self.dir} has no {key!r} artifact: its export could not write it "
                f"({' '.join(self.manifest.failed[key].split())}). Use the formats it holds "
                f"({', '.join(f.key for f in self.formats()) or 'none'}) or re-export."
            )
        return artifact_path(self.dir, self.manifest, key)

    def formats(self) -> list[registry.Format]:
        """The registered formats this export holds, in registry order."""
        return [f for f in registry.all_formats() if f.key in self.manifest.artifacts]

    def load(self, key: str, device: str = "cpu", threads: int | None = None) -> Runner:
        """Artifact `key` as a Runner (named tensors in and out), sha256 checked first.
        Through its descriptor (pipeline_runtime.formats), not the registry: a serving
        process may load a format whose module it never imported."""
        from pipeline_runtime import runners

        path = self.path(key)
        try:
            return runners.load(
                key,
                path,
                inputs=self.manifest.input_names,
                outputs=self.manifest.output_names,
                device=device,
                threads=threads,
                record=self.manifest.artifact(key).details,
            )
        except LoadError as err:
            raise ArtifactError(str(err)) from None

    @torch.inference_mode()
    def eager(self, inputs: Inputs) -> dict[str, torch.Tensor]:
        """The reference outputs, named as the manifest names them."""
        return name_outputs(self.model(*inputs.values()), self.manifest.output_names)

    def _load_tensors(self, key: str) -> Any:
        if key not in self._tensors:
            path = self.path(key)
            try:
                self._tensors[key] = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as err:  # noqa: BLE001 - report any unreadable file the same way
                raise ArtifactError(
                    f"{path} cannot be read ({err}); re-run `pipeline export`."
                ) from None
        return self._tensors[key]

    def golden(self) -> tuple[Inputs, dict[str, torch.Tensor]]:
        """The golden inputs and the eager outputs export stored for them."""
        data = self._load_tensors(GOLDEN_KEY)
        return dict(data["inputs"]), dict(data["outputs"])

    def probes(self) -> list[tuple[str, Inputs]]:
        """The probe inputs export stored (chosen to drive every branch)."""
        if PROBES_KEY not in self.manifest.artifacts:
            return []
        return [(str(label), dict(p)) for label, p in self._load_tensors(PROBES_KEY)["probes"]]

    def sample(self, batch: int, seed: int = 0) -> Inputs:
        """Fresh random inputs of `batch` samples from the declared input spec."""
        gen = torch.Generator().manual_seed(seed)
        return self.entry.sample_inputs(self.entry.sizes(batch=batch), gen)


# A copy of the checkpoint inside the export folder (pipeline.serving.versions writes it).
OWN_CHECKPOINT = "checkpoint.pt"


def _same_model(model: str, manifest: Manifest) -> bool:
    """`model` names the exported one: the same name, or the same `file.py:Class` given by
    another path (`/abs/mymodel.py:Net` for an export of `mymodel.py:Net`)."""
    if manifest.model.name == model:
        return True
    where, _, cls = model.rpartition(":")
    if not (where.endswith(".py") and manifest.model.file):
        return False
    return (
        Path(where).resolve() == Path(manifest.model.file)
        and manifest.model.name.rpartition(":")[2] == cls
    )


def open_export(
    export_dir: Path, *, model: str | None = None, checkpoint: Path | None = None
) -> ExportedModel:
    """Open `export_dir`. `model`: the name the caller expects (a mismatch is an error);
    `checkpoint`: another copy of the export's checkpoint (its sha256 must match)."""
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    if model is not None and not _same_model(model, manifest):
        raise ArtifactError(
            f"{export_dir} holds an export of {manifest.model.name!r}, not {model!r}. "
            f"Pass --model {manifest.model.name!r} or another --export-dir."
        )
    entry = (
        get_entry(manifest.model.name)
        if manifest.model.source == "zoo"
        else entry_from_manifest(manifest)
    )
    ckpt_path = Path(checkpoint) if checkpoint else export_dir / manifest.checkpoint.path
    if checkpoint is None and not ckpt_path.is_file() and (export_dir / OWN_CHECKPOINT).is_file():
        # A self-contained export (a version in the store, `pipeline publish`) carries its
        # own copy; its sha256 is checked below like any other.
        ckpt_path = export_dir / OWN_CHECKPOINT
    if checkpoint is None and not ckpt_path.is_file():
        # An export folder moved or copied without its checkpoint: the generic "train one"
        # advice of load_checkpoint was wrong here, the checkpoint exists somewhere.
        raise ArtifactError(
            f"{export_dir} was exported from the checkpoint {manifest.checkpoint.path!r} "
            f"(relative to the export folder; sha256 {manifest.checkpoint.sha256[:12]}…), "
            f"which is not at {os.path.normpath(ckpt_path)}: eager PyTorch needs its weights. "
            "Pass --checkpoint PATH (the same file; its sha256 is checked), or keep the "
            "export folder beside it; `pipeline publish` makes a copy that carries its own."
        )
    loaded = load_checkpoint(ckpt_path)
    if loaded.meta["weights_sha256"] != manifest.checkpoint.sha256:
        raise ArtifactError(
            f"Checkpoint {ckpt_path} is not the one {export_dir} was exported from (sha256 "
            f"{loaded.meta['weights_sha256'][:12]}… vs {manifest.checkpoint.sha256[:12]}…). "
            "Re-run `pipeline export` for this checkpoint."
        )
    eager = entry.build(**loaded.model_kwargs)
    eager.load_state_dict(loaded.state_dict)
    return ExportedModel(export_dir, manifest, entry, eager.eval(), ckpt_path)


def carry_checkpoint(export_dir: Path, manifest: Manifest, dest: Path) -> None:
    """The export's checkpoint as `dest`/checkpoint.pt, where open_export finds it (a deploy
    folder's copy of the export): an image's runtime opens a TorchScript or .pt2 export with
    its eager model, and a deploy folder holds no `../checkpoint.pt` (every such image
    stopped at start, a user's trial). The one whose sha256 the manifest records, or none:
    a checkpoint trained again since would stop the image the same way."""
    wanted = manifest.checkpoint.sha256
    there = export_dir / manifest.checkpoint.path
    for found in (export_dir / OWN_CHECKPOINT, there):
        try:
            meta = json.loads(sidecar_path(found).read_text())
        except (OSError, ValueError):
            continue
        if found.is_file() and isinstance(meta, dict) and meta.get("weights_sha256") == wanted:
            break
    else:
        raise ArtifactError(
            f"{export_dir} was exported from the checkpoint {manifest.checkpoint.path!r} "
            f"(sha256 {wanted[:12]}…), which is not at {os.path.normpath(there)}: the image's "
            f"runtime needs it to open the export. Deploy the export folder where it was made "
            "(export again after training again), or a published version, which carries its own."
        )
    if found.resolve() != (dest / OWN_CHECKPOINT).resolve():
        shutil.copy2(found, dest / OWN_CHECKPOINT)
        shutil.copy2(sidecar_path(found), sidecar_path(dest / OWN_CHECKPOINT))  # its metadata
