"""Loading one export for a runtime's worker (KServe's, Ray's replicas): torch-free for ONNX,
through torch otherwise.

A worker serving ONNX (or its int8/float16 variants) on CPU opens the file with ONNX
Runtime on numpy arrays and warms up on the export's `warmup.npz`: it never imports
torch, so it holds ~150 MB instead of ~650 MB (issue 40; `import torch` alone is
~500 MB). Any other format, or an export older than `warmup.npz`, loads through
`open_export(...).load(...)`, the Runner verify uses, and imports torch then.

`device`: "auto" (the default: a GPU where there is one), "cpu", "cuda" or "cuda:N".
ONNX goes to CUDA through ONNX Runtime's CUDA provider, still without torch: "auto"
uses it where this ONNX Runtime has it. A deployment's one config thus serves on CPU
in the CPU image and on the GPU in the GPU image (`pipeline deploy kserve`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core import signing
from pipeline.core.errors import ArtifactError
from pipeline.core.manifest import artifact_path, read_manifest
from pipeline_runtime import bounded, formats, ortsession
from pipeline_runtime.manifest import WARMUP_KEY, Manifest

log = logging.getLogger("pipeline.serving.loading")

Forward = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


@dataclass
class Loaded:
    """One artifact ready to serve: numpy arrays in, the manifest's outputs out, in order."""

    manifest: Manifest
    forward: Forward
    warmup: dict[str, np.ndarray]  # the golden inputs
    platform: str  # the OIP metadata's platform
    torch_free: bool
    device: str = "cpu"  # where it runs: "cpu" or "cuda:N"


def _descriptor(fmt: str, manifest: Manifest) -> formats.Descriptor:
    try:
        return formats.of(fmt, manifest.artifact(fmt).details)
    except formats.UnknownFormatError as err:  # a format this worker cannot know how to run
        raise ArtifactError(str(err.args[0])) from None


def lean(fmt: str, manifest: Manifest) -> bool:
    """Whether `fmt` of this export can be served without importing torch."""
    return _descriptor(fmt, manifest).torch_free and WARMUP_KEY in manifest.artifacts


def load(
    export_dir: Path,
    fmt: str,
    threads: int,
    trust: Sequence[str] = (),
    device: str = "auto",
    pinned: dict[str, list[str]] | None = None,
) -> Loaded:
    """Artifact `fmt` of `export_dir`, sha256 checked, on `device` (module docstring) with
    `threads` threads. A store's version is checked against the trust policy first
    (`trust`: the keys `serve` was given, beside the store's own; `pinned`: the keys the
    store's policy held as `serve` started; signing.recheck): a worker may load it long
    after `serve` checked it."""
    check_device(device)
    signing.recheck(export_dir, trust, pinned)
    manifest = read_manifest(export_dir)
    if fmt in manifest.unwritten or fmt not in manifest.artifacts:
        raise ArtifactError(
            f"{export_dir} has no {fmt!r} artifact; serve a format it holds "
            f"({', '.join(k for k in manifest.artifacts if k not in (WARMUP_KEY,))})."
        )
    if not _descriptor(fmt, manifest).served:
        raise ArtifactError(
            f"{fmt} is an on-device format: export, verify and bench take it, no runtime serves it."
        )
    if lean(fmt, manifest):
        loaded = _load_onnx(export_dir, fmt, manifest, threads, device)
    else:
        if _descriptor(fmt, manifest).torch_free:
            log.warning(
                "%s has no %s (exported before it existed): serving %s through torch; "
                "re-export to serve it torch-free",
                export_dir,
                WARMUP_KEY,
                fmt,
            )
        loaded = _load_torch(export_dir, fmt, threads, device)
    # A stacked batch past a .pt2's bounded batch goes in passes it takes (bounded.py).
    loaded.forward = bounded.within_bound(
        loaded.forward,
        {s.name: s.batch_axis for s in manifest.input_specs(fmt)},
        [o.batch_axis or 0 for o in manifest.outputs],
        bounded.batch_bound(manifest, fmt),
    )
    return loaded


def check_device(device: str) -> None:
    """Raise ArtifactError unless `device` is "auto", "cpu", "cuda" or "cuda:N"."""
    kind, _, index = device.partition(":")
    # ASCII digits: "cuda:²" passed isdigit() and failed int() later.
    if device in ("auto", "cpu", "cuda") or (
        kind == "cuda" and index.isascii() and index.isdigit()
    ):
        return
    raise ArtifactError(f"Unknown device {device!r}: use auto, cpu, cuda or cuda:N.")


def _ort_cuda_index(device: str) -> int | None:
    """The CUDA device ONNX Runtime is to use for `device`, or None for CPU."""
    if device == "cpu":
        return None
    import onnxruntime as ort

    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    if device == "auto":
        return 0 if has_cuda else None
    if not has_cuda:
        raise ArtifactError(
            f"--device {device}: this ONNX Runtime ({ort.__version__}) has no "
            "CUDAExecutionProvider; install onnxruntime-gpu, or serve with --device cpu/auto."
        )
    return int(device.partition(":")[2] or 0)


def _load_onnx(export_dir: Path, fmt: str, manifest: Manifest, threads: int, device: str) -> Loaded:
    cuda = _ort_cuda_index(device)
    session, on_cuda = ortsession.open_session(
        artifact_path(export_dir, manifest, fmt), cuda, threads, manifest.artifact(fmt)
    )
    # The session's own input names, in the manifest's order (the export wrote both).
    names = [i.name for i in session.get_inputs()]
    order = dict(zip(manifest.input_names, names, strict=True))
    if len(session.get_outputs()) != len(manifest.output_names):
        raise ArtifactError(
            f"{export_dir}'s {fmt} file has {len(session.get_outputs())} outputs, its manifest "
            f"names {len(manifest.output_names)}; re-export it."
        )

    def forward(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        # Outputs by position, in the manifest's order, as runners.load_onnx gives them.
        return session.run(None, {order[k]: v for k, v in batch.items()})

    with np.load(artifact_path(export_dir, manifest, WARMUP_KEY), allow_pickle=False) as saved:
        warmup = {k: saved[k] for k in saved.files}
    where = f"cuda:{cuda}" if on_cuda else "cpu"
    platform = _descriptor(fmt, manifest).platform
    return Loaded(manifest, forward, warmup, platform, torch_free=True, device=where)


def _load_torch(export_dir: Path, fmt: str, threads: int, device: str) -> Loaded:
    import torch

    from pipeline.core.device import resolve_indexed
    from pipeline.export.opened import open_export

    torch.set_num_threads(max(1, threads))
    exported = open_export(export_dir)
    wanted = resolve_indexed(device)
    # A .pt2 compiled for the other kind of device runs where it can (runners.aoti_load).
    runner = exported.load(fmt, str(wanted), threads)

    def forward(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            outputs = runner({k: torch.from_numpy(v) for k, v in batch.items()})
        return [t.detach().cpu().numpy() for t in outputs.values()]

    golden, _ = exported.golden()
    warmup = {k: v.numpy() for k, v in golden.items()}
    platform = _descriptor(fmt, exported.manifest).platform
    where = str(runner.device)
    return Loaded(exported.manifest, forward, warmup, platform, torch_free=False, device=where)
