"""TorchServe handler for the pipeline's int8 AOTInductor packages (`model.int8.pt2`, torchao).

Everything but the format key is `pipeline_runtime.handler` (shipped in the archive).
"""

from pipeline_runtime.handler import PipelineHandler


class Pt2Int8Handler(PipelineHandler):
    format_key = "pt2_int8"
