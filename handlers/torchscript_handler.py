"""TorchServe handler for the pipeline's TorchScript artifacts (CPU or CUDA)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pl_base_handler import PipelineHandler, flatten_outputs


class TorchScriptHandler(PipelineHandler):
    artifact_key = "torchscript"

    def _load(self, path: Path) -> None:
        self.model = torch.jit.load(str(path), map_location=self.device)
        self.model.eval()

    def _forward(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            inputs = [torch.from_numpy(batch[s.name]).to(self.device) for s in self.specs]
            return [t.detach().cpu().numpy() for t in flatten_outputs(self.model(*inputs))]
