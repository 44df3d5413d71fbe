"""What every format exports for a model with per-sample outputs (a detector's list of
`{boxes, scores, labels}` per image): the model wrapped so that it answers in the
collated form (pipeline_runtime/outputs.py): each field concatenated over the images,
batch-major, then `counts`, one int64 per image.

The wrapper is written for both ways a graph is captured: scripted, it keeps the
per-image loop (any batch); traced (the ONNX path torchvision documents), the loop is
unrolled for the example's batch, which export records as a fixed axis. The counts are
computed from the tensors (`ones_like(...).sum()`), never read as Python ints, so a
trace does not bake the example's box counts into the graph.
"""

from typing import Dict, Final, List  # noqa: UP035 - TorchScript reads these annotations

import torch
from torch import nn

from pipeline.core.noise import library_warnings

# TorchScript's reason when `auto` scripts such a model without trying a trace.
UNTRACED = "trace not tried: per-sample outputs (a trace unrolls the per-image loop to the example's batch)"


class PerSampleOutputs(nn.Module):
    """`model` (one tensor in, a list of per-sample dicts out) answering collated tensors."""

    fields: Final[List[str]]  # noqa: UP006

    def __init__(self, model: nn.Module, fields: "tuple[str, ...]") -> None:
        super().__init__()
        self.model = model
        self.fields = list(fields)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:  # noqa: UP006
        samples: List[Dict[str, torch.Tensor]] = self.model(x)  # noqa: UP006
        out: List[torch.Tensor] = []  # noqa: UP006
        for name in self.fields:
            out.append(torch.cat([s[name] for s in samples], 0))
        counts: List[torch.Tensor] = []  # noqa: UP006
        for s in samples:
            rows = s[self.fields[0]]
            if rows.dim() > 1:
                rows = rows.flatten(1)[:, 0]
            counts.append(torch.ones_like(rows, dtype=torch.int64).sum())
        out.append(torch.stack(counts))
        return out


class DetectionsOf(nn.Module):
    """A scripted model whose answer is torchvision's scripted `(losses, detections)`,
    answering the detections alone: what PerSampleOutputs takes."""

    def __init__(self, model: torch.jit.ScriptModule) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> List[Dict[str, torch.Tensor]]:  # noqa: UP006
        return self.model(x)[1]


# The type TorchScript gives a scripted torchvision detector's answer.
_LOSSES_AND_DETECTIONS = "Tuple[Dict[str, Tensor], List[Dict[str, Tensor]]]"


def script_losses_and_detections(wrapper: PerSampleOutputs) -> torch.jit.ScriptModule | None:
    """`wrapper` scripted when its model scripts to torchvision's `(losses, detections)`
    answer (a user's own wrapper that returns a torchvision detector's answer as it is):
    the detections are taken from it. None when the model does not script, or scripts
    to another answer."""
    # torch.jit's deprecation FutureWarning is expected (see DESIGN.md): -v only.
    with library_warnings("torch.jit.script", FutureWarning):
        try:
            inner = torch.jit.script(wrapper.model)
        except Exception:  # noqa: BLE001 - TorchScript's frontend raises many types
            return None
        returns = inner.forward.schema.returns
        if len(returns) != 1 or str(returns[0].type) != _LOSSES_AND_DETECTIONS:
            return None
        return torch.jit.script(PerSampleOutputs(DetectionsOf(inner), tuple(wrapper.fields)))
