"""TorchServe handler for the pipeline's TorchScript artifacts (`model.torchscript.pt`, `torch.jit.load`).

Everything but the format key is `pipeline_runtime.handler` (shipped in the archive).
"""

from pipeline_runtime.handler import PipelineHandler


class TorchScriptHandler(PipelineHandler):
    format_key = "torchscript"
