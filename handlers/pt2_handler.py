"""TorchServe handler for the pipeline's AOTInductor packages (`model.pt2`).

Everything but the format key is `pipeline_runtime.handler` (shipped in the archive).
"""

from pipeline_runtime.handler import PipelineHandler


class Pt2Handler(PipelineHandler):
    format_key = "pt2"
