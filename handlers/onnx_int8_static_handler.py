"""TorchServe handler for the pipeline's `onnx_int8_static` artifacts (run by ONNX Runtime).

Everything but the format key is `pipeline_runtime.handler` (shipped in the archive).
"""

from pipeline_runtime.handler import PipelineHandler


class OnnxInt8StaticHandler(PipelineHandler):
    format_key = "onnx_int8_static"
