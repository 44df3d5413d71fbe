"""Whether one sample of a served model fits in a request at all (`pipeline serve`'s word).

A ResNet-50 detector takes 800×800 images: one is 7.7 MB even as binary float32, over the
servers' 4 MiB default `--max-request-size`, so every request got a 413 whose advice
("split it") cannot apply to a single image, and serve said nothing (a user's trial).
Said at start for each served model whose inputs have a fixed size per sample.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.serving.server import Server
from pipeline_runtime.manifest import Manifest


def sample_bytes(manifest: Manifest, fmt: str) -> int | None:
    """The bytes one sample's inputs take as binary (`.npy`), or None when a non-batch
    axis is dynamic (the size is the client's)."""
    specs = manifest.input_specs(fmt)
    total = 0
    for spec in specs:
        dims = [d for d in spec.shape if d != "batch"]
        if not all(isinstance(d, int) for d in dims):
            return None
        total += int(np.prod(dims, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    return total


def oversize_lines(server: Server, limit: int, manifest_of: Callable[[str], Manifest]) -> list[str]:
    """A warning per served model whose one sample cannot fit under `limit` bytes
    (`manifest_of`: a model's export manifest, the one serve opened where it has it)."""
    lines = []
    for name, info in sorted(server.served.items()):
        try:
            size = sample_bytes(manifest_of(info.model), info.format)
        except (PipelineError, TypeError, ValueError):
            continue  # a bfloat16 input (no NumPy twin), a model not found: nothing to say
        if size is not None and size > limit:
            mib = -(-size * 2 // (1024 * 1024))  # room for two samples, in whole MiB
            lines.append(
                f"warning: one sample of {name} is {size:,} bytes even as binary (.npy), over "
                f"--max-request-size {limit:,}: every request would be refused with a 413. "
                f"Serve with --max-request-size {mib * 1024 * 1024} or more."
            )
    return lines
