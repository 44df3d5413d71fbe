"""TorchServe handler for the pipeline's `onnx_fp16` artifacts (run by ONNX Runtime).

Everything but the format key is `pipeline_runtime.handler` (shipped in the archive).
"""

from pipeline_runtime.handler import PipelineHandler


class OnnxFp16Handler(PipelineHandler):
    format_key = "onnx_fp16"
