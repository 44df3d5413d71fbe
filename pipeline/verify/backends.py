"""Backends that run an exported model from disk, each behind one small class.

Every backend takes the same named inputs and returns a flat list of output
tensors in manifest order, so `verify` compares them all the same way.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Protocol

import torch

from pipeline.compare import flatten_outputs
from pipeline.manifest import artifact_path
from pipeline.zoo.spec import Inputs


class Backend(Protocol):
    name: str

    def run(self, inputs: Inputs) -> list[torch.Tensor]: ...


class EagerBackend:
    """The reference: the checkpoint loaded into the zoo model, in eval mode."""

    name = "eager"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()

    @torch.inference_mode()
    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        return flatten_outputs(self.model(*inputs.values()))


class TorchScriptBackend:
    name = "torchscript"

    def __init__(self, export_dir: Path, manifest: dict[str, Any]) -> None:
        path = artifact_path(export_dir, manifest, "torchscript")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self.module = torch.jit.load(str(path), map_location="cpu")

    @torch.inference_mode()
    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        return flatten_outputs(self.module(*inputs.values()))


def ort_session_options(threads: int | None = None) -> Any:
    """ONNX Runtime options for sharing a process with PyTorch.

    Spinning threads off: with ORT's default spin-waiting, eager PyTorch in the
    same process ran about 12× slower on the reference 2-core machine
    (../shared/DESIGN.md).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, export_dir: Path, manifest: dict[str, Any]) -> None:
        import onnxruntime as ort

        path = artifact_path(export_dir, manifest, "onnx")
        self.session = ort.InferenceSession(
            str(path), ort_session_options(), providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        feed = {name: inputs[name].detach().cpu().numpy() for name in self.input_names}
        return [torch.from_numpy(a) for a in self.session.run(None, feed)]


BACKENDS: tuple[str, ...] = ("torchscript", "onnxruntime")
_FACTORIES = {"torchscript": TorchScriptBackend, "onnxruntime": OnnxRuntimeBackend}


def load_backend(name: str, export_dir: Path, manifest: dict[str, Any]) -> Backend:
    return _FACTORIES[name](export_dir, manifest)
