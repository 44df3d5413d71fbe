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
rescales the last classification layer(s) to the logit spread at which the most of
the detector's detections are *firm* under verify's rule (pipeline/core/detections.py),
measured on the golden inputs: no fixed spread does for every family and class count
(docs/verification.md, "Detections").

A torchvision detector's `state_dict` (what a user fine-tunes and saves) loads into
the wrapper as it is: its keys gain the wrapper's `model.` prefix on the way in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeline.zoo.spec import Inputs, TensorSpec

# The side of a detector's input when its builder's size cannot be read (see native_input).
FALLBACK_SIDE = 320
# The logit spreads (std of the classification layers' outputs) spread_scores tries:
# doublings first, then the two √2 steps around the best. A spread too small leaves
# scores crowded (SSDlite at 91 classes: 265 of 600 detections firm at 1.0), one too
# large saturates them near 1.0 and brings ties back (0 firm at 8); the best lies
# between, where it lies differs by family (measured 2026-11-27: SSDlite 91 classes
# 436 of 600 firm at 2; Faster R-CNN's MobileNet 320 188 of 200 at 2, 180 at 4).
SPREADS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
UNMEASURED_SPREAD = 1.0  # when the answer carries no scores to count firm ones in
# Sigmoid heads (RetinaNet, FCOS) score each class alone from a prior bias of -4.6 (1%
# foreground): what they keep is the far tail of their logits, just over the 0.05
# threshold, where the scores crowd (measured: RetinaNet 264 of 600 firm, FCOS 8 of 11).
# Their bias is also tried shifted so that the logit ranked as the last kept detection
# sits at each of these values (0: a score of 0.5), the kept scores then spread across
# the sigmoid's steep middle.
SHIFT_TARGETS = (0.0,)
# A spread also magnifies float32's rounding: at FCOS's chosen 11.3 (320x320 inside) eager
# float32's scores were 2.9e-4 from the same model's in float64, past the rule's 2e-4, so
# ONNX Runtime (3.5e-4 from eager) failed on rounding alone. A spread is taken only where
# eager's own rounding (float32 against float64, under the rule) uses at most this share
# of the rule's score tolerance: the rest is the backend's.
ROUNDING_SHARE = 0.5
ROUNDING_CHECKS = 6  # float64 forwards at most (each ~3x a float32 one), most firm first


def native_input(arch: str, kwargs: dict[str, Any]) -> TensorSpec:
    """`images` [batch, 3, S, S] at the size the detector computes at: its transform's
    fixed size (SSD, SSDlite) or the smallest side it scales to (800 for the ResNet-50
    models, or `min_size` among `kwargs`), so the transform does not resample the input.
    Resampled, a noise image carries float32's rounding in (320 -> 800: 1.2e-4 of the
    pixels' spread) and a random ResNet-50 grows it 300-fold by its last stage: eager
    float32 and float64 then differ past the detection rule, and so does every backend."""
    import torchvision

    try:
        with torch.device("meta"):  # the builder's settings without its weights' memory
            built = torchvision.models.get_model(
                arch, weights=None, **{"weights_backbone": None, **kwargs}
            )
        transform = built.transform
        fixed = getattr(transform, "fixed_size", None)
        side = int(transform.min_size[-1])
        height, width = (int(fixed[0]), int(fixed[1])) if fixed else (side, side)
    except Exception:  # noqa: BLE001 - a builder that does not build on meta: a plain size
        height = width = FALLBACK_SIDE
    return TensorSpec("images", ("batch", 3, height, width), torch.float32, 0.0, 1.0)


def detector_names() -> list[str]:
    """torchvision's detection builders (`torchvision.models.detection`)."""
    import torchvision

    return torchvision.models.list_models(module=torchvision.models.detection)


def detector_types() -> tuple[type, ...]:
    """The classes every torchvision detector is an instance of."""
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
    from torchvision.models.detection.ssd import SSD

    return (GeneralizedRCNN, SSD, *sigmoid_types())


def find_detectors(model: nn.Module) -> list[nn.Module]:
    """The torchvision detectors inside `model` (itself included), outermost first."""
    kinds = detector_types()
    found: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, kinds) and not any(module in set(f.modules()) for f in found):
            found.append(module)
    return found


class TorchvisionDetector(nn.Module):
    """A torchvision detector taking one batch tensor; eager and scripted answer alike."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._register_load_state_dict_pre_hook(_prefix_bare_keys)

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        out = self.model([images[i] for i in range(images.shape[0])])
        if torch.jit.is_scripting():
            return out[1]  # scripted detectors answer (losses, detections)
        return out


def scripting_advice(model: nn.Module) -> str | None:
    """What to write when a model holding a torchvision detector does not script; None
    for a model that holds none."""
    found = find_detectors(model)
    if not found:
        return None
    name = next(n for n, m in model.named_modules() if m is found[0]) or "the model"
    return (
        f"It holds a torchvision detector ({name}: {type(found[0]).__name__}), which scripted "
        "answers (losses, detections) and takes a List[Tensor] of images. Write its forward as "
        "pipeline/zoo/detection.py's TorchvisionDetector does: "
        "`out = self.m([images[i] for i in range(images.shape[0])])`, then "
        "`return out[1] if torch.jit.is_scripting() else out`, with the return annotated "
        "`List[Dict[str, torch.Tensor]]`."
    )


def _prefix_bare_keys(
    state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:  # torch's load_state_dict pre-hook signature
    """torchvision's own detector keys (`backbone.…`) → the wrapper's (`model.backbone.…`)."""
    inner = f"{prefix}model."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key.removeprefix(prefix)] = state_dict.pop(key)


def build_detector(arch: str, **kwargs: Any) -> TorchvisionDetector:
    """torchvision detector `arch` with random weights (no download: nor for the backbone)."""
    import torchvision

    kwargs.setdefault("weights_backbone", None)
    return TorchvisionDetector(torchvision.models.get_model(arch, weights=None, **kwargs))


def sigmoid_types() -> tuple[type, ...]:
    """The detectors whose class scores are per-class sigmoids with a prior bias."""
    from torchvision.models.detection.fcos import FCOS
    from torchvision.models.detection.retinanet import RetinaNet

    return (RetinaNet, FCOS)


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


def _images(answer: Any) -> list[Any] | None:
    """Each image's detections in a detector's answer (a list of per-image dicts, or
    TorchScript's `(losses, detections)`) as the rule's Images; None when it is neither."""
    from pipeline.core.detections import Image

    if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], dict):
        answer = answer[1]
    fields = ("boxes", "scores", "labels")
    if (
        isinstance(answer, list | tuple)
        and answer
        and all(
            isinstance(d, dict) and all(isinstance(d.get(f), torch.Tensor) for f in fields)
            for d in answer
        )
    ):
        return [Image(*(d[f].float() if f != "labels" else d[f] for f in fields)) for d in answer]
    return None


class _Rounding:
    """How far float32 rounding moves `model`'s detections: its answer against a float64
    copy's, under verify's rule (the copy made on first use; float64 forwards are slow)."""

    def __init__(self, model: nn.Module, inputs: Inputs) -> None:
        self.model, self.inputs = model, inputs
        self.wide: nn.Module | None = None

    def error(self, narrow: list[Any]) -> float | None:
        """The worst score difference, or None when the rule finds more than that (an
        unmatched detection, a box apart) or float64 does not run."""
        import copy

        from pipeline.core.detections import Verdict, compare_image

        try:
            if self.wide is None:
                self.wide = copy.deepcopy(self.model).double()
            self.wide.load_state_dict(self.model.state_dict())
            wide = _images(
                self.wide(
                    *(v.double() if v.is_floating_point() else v for v in self.inputs.values())
                )
            )
        except (RuntimeError, TypeError):  # an op without a float64 kernel
            return None
        if wide is None or len(wide) != len(narrow):
            return None
        verdict = Verdict()
        for index, (w, n) in enumerate(zip(wide, narrow, strict=True)):
            compare_image(w, n, index, verdict)
        return None if verdict.problems else verdict.score_err


@torch.no_grad()
def spread_scores(model: nn.Module, inputs: Inputs) -> str:
    """Rescale the classification layers of every torchvision detector in `model` so the
    logits' spread on `inputs` is the one of SPREADS at which the most of `model`'s
    detections are firm; returns what was done, for the manifest's init note."""
    from pipeline.core.detections import firm_count

    detectors = find_detectors(model)
    layers = [layer for d in detectors for layer in classification_layers(d)]
    if not layers:
        return "no classification head found to spread the scores of: they may all tie"
    # The number of detections a sigmoid head's layer keeps over the golden batch.
    batch = int(next(iter(inputs.values())).shape[0])
    kept = {
        id(layer): int(getattr(d, "detections_per_img", 100)) * batch
        for d in detectors
        if isinstance(d, sigmoid_types())
        for layer in classification_layers(d)
    }
    # Over every call: RetinaNet's and FCOS's head runs once per pyramid level, and the
    # levels' spreads differ by orders of magnitude (the last alone was 0.0021).
    moments: dict[int, list[float]] = {}
    tops: dict[int, torch.Tensor] = {}  # a sigmoid head's highest logits, every level's

    def record(k: int, out: torch.Tensor) -> None:
        n, total, squares = moments.setdefault(k, [0.0, 0.0, 0.0])
        x = out.double()
        moments[k] = [n + x.numel(), total + float(x.sum()), squares + float((x * x).sum())]
        if id(layers[k]) in kept:
            both = torch.cat([tops.get(k, x.new_empty(0)), x.flatten()])
            tops[k] = both.topk(min(kept[id(layers[k])], both.numel())).values

    hooks = [
        layer.register_forward_hook(lambda _m, _i, out, k=k: record(k, out))
        for k, layer in enumerate(layers)
    ]
    try:
        model(*inputs.values())
    finally:
        for hook in hooks:
            hook.remove()
    stds = {
        k: max(squares / n - (total / n) ** 2, 0.0) ** 0.5
        for k, (n, total, squares) in moments.items()
        if n
    }
    scaled = [k for k in range(len(layers)) if stds.get(k)]  # a zero spread cannot be scaled
    original = {k: layers[k].weight.clone() for k in scaled}
    biases = {k: layers[k].bias.clone() for k in scaled if layers[k].bias is not None}
    shiftable = [k for k in scaled if k in tops and k in biases and tops[k].numel()]
    targets: tuple[float | None, ...] = (None, *SHIFT_TARGETS) if shiftable else (None,)

    def set_spread(spread: float, target: float | None) -> None:
        # The weights only: the bias is the prior torchvision gave the head (RetinaNet's
        # and FCOS's -4.6, a 1% foreground probability, constant over the classes, so it
        # takes no part in the spread). Scaled with the weights it pushed every score
        # under their 0.05 threshold: no detections at all.
        for k in scaled:
            layers[k].weight.copy_(original[k] * (spread / stds[k]))
            if k in biases:
                layers[k].bias.copy_(biases[k])
        for k in shiftable if target is not None else ():
            # The last kept logit at this spread (the bias is constant over the channels,
            # so the weights' scale moves every logit's distance from it alike).
            prior = float(biases[k].mean())
            last = (float(tops[k][-1]) - prior) * (spread / stds[k]) + prior
            layers[k].bias.add_(target - last)

    answers: dict[tuple[float, float | None], list[Any]] = {}

    def firm_at(spread: float, target: float | None) -> tuple[int, int]:
        set_spread(spread, target)
        images = _images(model(*inputs.values()))
        if images is None:
            return -1, 0
        answers[(spread, target)] = images
        return sum(firm_count(i.scores) for i in images), sum(i.count for i in images)

    tried = {(spread, t): firm_at(spread, t) for spread in SPREADS for t in targets}
    best = max(tried, key=lambda st: tried[st][0])
    before = ", ".join(f"{stds[k]:.2g}" for k in scaled)
    if tried[best][0] < 0:
        set_spread(UNMEASURED_SPREAD, None)
        return (
            f"classification logits rescaled from std {before} to {UNMEASURED_SPREAD:g} so "
            "detection scores spread (the answer has no per-image scores to measure by)"
        )
    spread, target = best
    for around in (spread / 2**0.5, spread * 2**0.5):
        tried[(around, target)] = firm_at(around, target)
    best, rounding = _steady(tried, answers, _Rounding(model, inputs), set_spread)
    set_spread(*best)
    firm, count = tried[best]
    shifted = (
        ""
        if best[1] is None
        else f", the bias shifted to put the last kept detection's logit at {best[1]:g}"
    )
    return (
        f"classification logits rescaled from std {before} to {best[0]:.3g}{shifted}: "
        f"{firm} of {count} detections firm on the golden inputs, {rounding} (random "
        "weights tie every score otherwise)"
    )


def _steady(
    tried: dict[tuple[float, float | None], tuple[int, int]],
    answers: dict[tuple[float, float | None], list[Any]],
    rounding: _Rounding,
    set_spread: Any,
) -> tuple[tuple[float, float | None], str]:
    """The setting with the most firm detections among those whose float32 rounding stays
    within ROUNDING_SHARE of the rule's score tolerance, and what was found, for the note.
    Settings that leave too few detections firm to judge are not measured."""
    from pipeline.core.detections import MIN_FIRM_SHARE, SCORE_ATOL

    ranked = sorted(tried, key=lambda st: -tried[st][0])
    judged = [st for st in ranked if tried[st][1] and tried[st][0] >= MIN_FIRM_SHARE * tried[st][1]]
    limit = SCORE_ATOL * ROUNDING_SHARE
    errors: dict[tuple[float, float | None], float | None] = {}
    noisy: list[tuple[float, float | None]] = []
    for setting in judged:
        if len(errors) == ROUNDING_CHECKS:
            break
        # Rounding grows with the spread (it scales the logits, their errors alike): past
        # a spread found too noisy at the same bias target, a larger one is not measured.
        if any(setting[1] == t and setting[0] >= s for s, t in noisy):
            continue
        set_spread(*setting)
        errors[setting] = rounding.error(answers[setting])
        if errors[setting] is None or errors[setting] > limit:
            noisy.append(setting)
        else:
            skipped = sum(tried[st][0] > tried[setting][0] for st in tried)
            also = (
                f"; {skipped} firmer setting(s) passed over for their rounding" if skipped else ""
            )
            return setting, (
                f"the most of any setting whose float32 rounding moves scores by at most "
                f"{limit:g} against float64 (here {errors[setting]:.2g}{also})"
            )
    if not errors:
        return ranked[0], "the most of any spread tried, too few to judge"
    worst = [e for e in errors.values() if e is not None]
    moved = f"by up to {max(worst):.2g}" if worst else "past the rule's tolerance"
    return ranked[0], (
        f"the most of any spread tried, though float32 rounding moves scores {moved} "
        f"against float64 at every one judged (more than {limit:g}): a backend may differ "
        "from eager by rounding alone"
    )


def spread_inner_scores(model: nn.Module, inputs: Inputs) -> str:
    """spread_scores for a user's own model that holds a torchvision detector (a wrapper);
    nothing for one that holds none."""
    return spread_scores(model, inputs) if find_detectors(model) else ""
