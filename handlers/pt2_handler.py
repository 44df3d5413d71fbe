"""TorchServe handler for the pipeline's `.pt2` artifacts (torch.export + AOTInductor).

The package is compiled C++ for one device kind: `torch._inductor.aoti_load_package`
extracts its shared library to a temporary folder (TorchServe's TMPDIR) and
returns a callable that takes the inputs in forward() order.

The compiled code trusts its inputs: a wrong one is read out of bounds (a
`my_cell` package called with x of batch 2,000,000 and h of batch 1
segfaulted). Requests are checked in Python first (shapes, dtypes, NaN/Inf and
inputs that disagree on a shared axis, in pl_codec), and the package's own
runtime check is switched on as a last line (AOTI_RUNTIME_CHECK_INPUTS=1,
read by the generated code; export compiles with `check_lowerbound` off so
that a batch of 1 passes it). Tensors are made contiguous because the kernels
assume the exported strides.

Threads: the kernels' `#pragma omp parallel` regions run in the OpenMP runtime
torch already loaded, so `torch.set_num_threads` (the base class) applies.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from pl_base_handler import PipelineHandler, flatten_outputs

logger = logging.getLogger(__name__)


class Pt2Handler(PipelineHandler):
    artifact_key = "pt2"

    def _load(self, path: Path) -> None:
        compiled_for = self.manifest["artifacts"][self.artifact_key].get("device", "cpu")
        if compiled_for == "cuda" and self.device.type != "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"{path.name} was compiled by AOTInductor for CUDA and this worker has no CUDA. "
                    "Serve it on a GPU machine, or re-export with --pt2-device cpu."
                )
            logger.info("%s was compiled for CUDA: serving it on cuda:0, not CPU", path.name)
            self.device = torch.device("cuda:0")
        elif compiled_for == "cpu" and self.device.type == "cuda":
            logger.info(
                "%s was compiled for CPU: serving it on CPU, not %s (export with --pt2-device "
                "cuda for a GPU package)",
                path.name,
                self.device,
            )
            self.device = torch.device("cpu")
        os.environ.setdefault("AOTI_RUNTIME_CHECK_INPUTS", "1")  # see the module docstring
        # -1: the package's own device (CPU, or cuda:0 for a CUDA package); N: cuda:N.
        index = self.device.index if self.device.type == "cuda" else -1
        self.model = torch._inductor.aoti_load_package(str(path), device_index=index)

    def _forward(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            inputs = [
                torch.from_numpy(np.ascontiguousarray(batch[s.name])).to(self.device)
                for s in self.specs
            ]
            return [t.detach().cpu().numpy() for t in flatten_outputs(self.model(*inputs))]
