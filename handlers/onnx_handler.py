"""TorchServe handler for the pipeline's ONNX artifacts, run by ONNX Runtime.

An InferenceSession is not callable like a module, so this handler has its
own forward step. On a GPU worker it asks for the CUDA execution provider and
falls back to CPU (with a log line) when that provider is not installed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pl_base_handler import PipelineHandler

logger = logging.getLogger(__name__)


class OnnxHandler(PipelineHandler):
    artifact_key = "onnx"

    def _load(self, path: Path) -> None:
        options = ort.SessionOptions()
        threads = int(
            os.environ.get("PIPELINE_WORKER_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        )
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        # No spin-waiting: it steals the CPU from everything else in the worker.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        providers: list = ["CPUExecutionProvider"]
        if self.device.type == "cuda":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers = [
                    ("CUDAExecutionProvider", {"device_id": self.device.index or 0}),
                    "CPUExecutionProvider",
                ]
            else:
                logger.info("CUDA worker but onnxruntime has no CUDAExecutionProvider; using CPU")
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def _forward(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.session.run(None, {n: batch[n] for n in self.input_names}))
