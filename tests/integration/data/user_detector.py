"""A user's own detector wrapper (issue 49): a torchvision SSDlite held as `self.m`, its
answer returned as it is. Scripted, that answer is torchvision's `(losses, detections)`;
export takes the detections from it. Small settings of the user's own choosing."""

import torch
import torchvision


class MyDetector(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=5, detections_per_img=20
        )

    def forward(self, image: torch.Tensor):
        return self.m(list(image))
