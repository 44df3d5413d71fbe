"""TorchServe handler for the pipeline's ONNX artifacts (`model.onnx`, run by ONNX Runtime).

Everything but the format key is `pipeline_runtime.handler` (shipped in the archive).
"""

from pipeline_runtime.handler import PipelineHandler


class OnnxHandler(PipelineHandler):
    format_key = "onnx"
