"""int8 `.pt2`: torchao's int8 Linear layers, compiled by AOTInductor, run from Python and C++.

torchao 0.18 works with torch 2.14.1 on CPU (docs/export.md, "torchao").
`quantize_(model, Int8DynamicActivationInt8WeightConfig())` swaps every
`nn.Linear` weight for an int8 tensor (per-row scales) and quantises each
activation per request; torch.export traces that into torchao's quantise ops
and `aten._int_mm`, and AOTInductor lowers them all to plain C++. The package
therefore needs neither torchao nor Python to run: the C++ client loads it
like any `.pt2` (verify's `cpp/pt2_int8` backend). Convolutions stay float32:
the config quantises Linear layers only, so a model without one has nothing
to quantise and this format's export fails with that reason.

The compiled package is judged at task level against float32 eager
(pipeline/export/quality.py), not elementwise against torchao's own eager int8
model: AOTInductor may round an activation scale differently from eager, which
moves an int8 value by one step and is no fault of either.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator

from torch import nn

from pipeline.core.errors import ExportError
from pipeline.core.noise import library_warnings
from pipeline.formats import reduced
from pipeline.formats.base import ExportContext, Format, register
from pipeline.formats.program import captured_output
from pipeline_runtime import formats
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger(__name__)

KEY = "pt2_int8"
FILE = "model.int8.pt2"
CONFIG = "Int8DynamicActivationInt8WeightConfig"
# torch logs (at WARNING, through logging) that torchao registers an Enum as a pytree
# constant, a call torch 2.14 deprecates; nothing here uses it.
_TORCHAO_IMPORT_NOISE = "torch.utils._pytree"


@contextlib.contextmanager
def quiet_torchao_import() -> Iterator[None]:
    """Around a first import of torchao: without torch's pytree warning about it."""
    pytree_log = logging.getLogger(_TORCHAO_IMPORT_NOISE)
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        with library_warnings("torchao"):
            yield
    finally:
        pytree_log.setLevel(level)


def _torchao() -> tuple[str, object, object]:
    """torchao's version, quantize_ and the config class; ExportError when it is missing."""
    try:
        with quiet_torchao_import():
            import torchao
            from torchao import quantization
    except ImportError as err:
        raise ExportError(
            f"--format {KEY} needs torchao ({err}); `make venv` installs the pinned version."
        ) from None
    return torchao.__version__, quantization.quantize_, getattr(quantization, CONFIG)


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    from pipeline.formats.pt2 import settings_record, to_pt2

    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    if not linears:
        raise ExportError(
            f"{ctx.entry.name!r} has no nn.Linear layer: torchao's {CONFIG} quantises Linear "
            "layers only, so there is nothing to make int8. Use --format onnx_int8_static."
        )
    version, quantize_, config = _torchao()
    quantized = copy.deepcopy(model)
    with library_warnings("torchao"), captured_output("torchao"):
        quantize_(quantized, config())  # type: ignore[operator]
    log.info(".pt2 int8 (torchao %s, %d Linear layer(s)) with AOTInductor…", version, linears)
    path = ctx.out_dir / FILE
    # The quantised copy is thrown away afterwards (torchao's weights refuse .to() back).
    result = to_pt2(
        quantized,
        ctx.golden,
        ctx.probes,
        ctx.entry,
        path,
        device=ctx.pt2_device,  # type: ignore[arg-type]
        atol=ctx.atol,
        rtol=ctx.rtol,
        check=False,  # judged at task level below, against float32 eager
        fix_axes=ctx.fix_axes,
        configs=ctx.pt2_settings.get("changes"),
    )
    return reduced.record(
        ctx,
        key=KEY,
        path=path,
        precision="int8",
        reason=f"torchao {version} {CONFIG} on {linears} Linear layer(s) (int8 weights, "
        f"activations quantised per request), then torch.export + AOTInductor: {result.reason}",
        details={
            "method": result.method,
            "device": result.device,
            "compile_seconds": round(result.compile_seconds, 1),
            **settings_record(ctx),
            "quantizer": {"torchao": version, "config": CONFIG, "linear_layers": linears},
            **result.details,
        },
    )


FORMAT = register(
    Format(
        key=KEY,
        title=".pt2 int8 (torchao)",
        file=FILE,
        served_suffix="pt2_int8",
        runner=formats.AOTI,
        backend="pt2_int8",
        platform="pytorch_aoti",
        export=export,
        default=False,
        cpp=True,
        precision="int8",
        description="torchao int8 Linear layers, torch.export + AOTInductor; Python and C++",
    )
)
