"""A compiled TorchScript module run against eager on the export's probes, the last check
before TorchScript is written (pipeline/formats/torchscript.py)."""

from __future__ import annotations

import torch
from torch import nn

from pipeline.core.compare import compare_outputs, flatten_outputs
from pipeline.core.errors import ExportError
from pipeline.zoo.detection import scripting_advice
from pipeline.zoo.spec import Inputs


def against_eager(
    model: nn.Module,
    module: torch.jit.ScriptModule,
    probes: list[tuple[str, Inputs]],
    atol: float,
    rtol: float,
    advice: str,
) -> str | None:
    """Where the compiled `module` differs from eager `model` on `probes` (None: nowhere);
    ExportError, with what to write, when it fails to run on one. `advice`: what to say
    for a model that holds no torchvision detector."""
    with torch.no_grad():
        for label, probe in probes:
            try:
                compiled = module(*probe.values())
            except Exception as err:  # noqa: BLE001 - it scripted, and fails when run
                # A torchvision detector inside, indexed as eager answers: scripted, it
                # answers (losses, detections) and `out[0]["boxes"]` raised KeyError here,
                # which export printed as a raw traceback.
                first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
                raise ExportError(
                    f"The TorchScript module fails on probe {label!r} ({first}). "
                    f"{scripting_advice(model) or advice}"
                ) from None
            worst = compare_outputs(
                flatten_outputs(model(*probe.values())), flatten_outputs(compiled), atol, rtol
            )
            if worst is not None:
                return f"probe {label!r}: {worst}"
    return None
