"""torchvision's detectors by name (`torchvision:ssdlite320_mobilenet_v3_large`), as the
pipeline takes them: one batch tensor in, torchvision's per-image detections out.

torchvision's detectors take a *list* of images and answer a list with one
`{boxes, scores, labels}` dict per image, whose box counts vary with the input
(`torchvision.models.detection`). `TorchvisionDetector` gives them the pipeline's
contract, a batch tensor `images` [batch, 3, H, W] with values in [0, 1), and keeps
their answer: export records it as per-sample outputs (pipeline_runtime/outputs.py).
Scripted, a torchvision detector returns `(losses, detections)`, so the wrapper
takes the second under TorchScript, as torchvision's own docs advise.

`--random-init` leaves a detector without signal: its classification logits come
out all but equal, every score is the same (0.2 over 5 classes) and which boxes
survive NMS is arbitrary, so no comparison of them could fail. `spread_scores`
rescales the last classification layer(s) so the logits have a spread of
`TARGET_LOGIT_STD` on random inputs (docs/verification.md, "Detections").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeline.zoo.spec import Inputs, TensorSpec

# 320: SSDlite320's own input size; torchvision's transform resizes to its size anyway.
DETECTION_INPUT = TensorSpec("images", ("batch", 3, 320, 320), torch.float32, 0.0, 1.0)
DETECTION_OUTPUTS = ("boxes", "scores", "labels", "counts")
# The spread of the classification logits after --random-init. About 1 gives kept scores
# from ~0.7 to ~1.0 for SSDlite (5 classes); 2-3 saturates most of them near 1.0 and
# brings back ties (measured on random inputs, 2026-11-25).
TARGET_LOGIT_STD = 1.0


def detector_names() -> list[str]:
    """torchvision's detection builders (`torchvision.models.detection`)."""
    import torchvision

    return torchvision.models.list_models(module=torchvision.models.detection)


class TorchvisionDetector(nn.Module):
    """A torchvision detector taking one batch tensor; eager and scripted answer alike."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        out = self.model([images[i] for i in range(images.shape[0])])
        if torch.jit.is_scripting():
            return out[1]  # scripted detectors answer (losses, detections)
        return out


def build_detector(arch: str, **kwargs: Any) -> TorchvisionDetector:
    """torchvision detector `arch` with random weights (no download: nor for the backbone)."""
    import torchvision

    kwargs.setdefault("weights_backbone", None)
    return TorchvisionDetector(torchvision.models.get_model(arch, weights=None, **kwargs))


def classification_layers(detector: nn.Module) -> list[nn.Module]:
    """The layers whose outputs are a torchvision detector's class logits."""
    model = getattr(detector, "model", detector)
    head = getattr(getattr(model, "head", None), "classification_head", None)
    if head is not None and hasattr(head, "module_list"):  # SSD, SSDlite: one per level
        return [
            block[-1] if isinstance(block, nn.Sequential) else block for block in head.module_list
        ]
    if head is not None and hasattr(head, "cls_logits"):  # RetinaNet, FCOS
        return [head.cls_logits]
    predictor = getattr(getattr(model, "roi_heads", None), "box_predictor", None)
    if predictor is not None and hasattr(predictor, "cls_score"):  # Faster/Mask/Keypoint R-CNN
        return [predictor.cls_score]
    return []


@torch.no_grad()
def spread_scores(detector: nn.Module, inputs: Inputs) -> str:
    """Rescale the classification layers so their logits' std on `inputs` is
    `TARGET_LOGIT_STD`; returns what was done, for the manifest's init note."""
    layers = classification_layers(detector)
    if not layers:
        return "no classification head found to spread the scores of: they may all tie"
    stds: dict[int, float] = {}
    hooks = [
        layer.register_forward_hook(
            lambda _m, _i, out, k=k: stds.__setitem__(k, float(out.float().std()))
        )
        for k, layer in enumerate(layers)
    ]
    try:
        detector(*inputs.values())
    finally:
        for hook in hooks:
            hook.remove()
    for k, layer in enumerate(layers):
        if not stds.get(k):  # a zero spread cannot be scaled: leave it and say so below
            continue
        factor = TARGET_LOGIT_STD / stds[k]
        layer.weight.mul_(factor)
        if getattr(layer, "bias", None) is not None:
            layer.bias.mul_(factor)
    before = ", ".join(f"{stds[k]:.2g}" for k in sorted(stds))
    return (
        f"classification logits rescaled from std {before} to {TARGET_LOGIT_STD:g} so "
        "detection scores spread (random weights tie every score otherwise)"
    )
