"""float16 ONNX: for GPU execution providers, float32 at the graph's inputs and outputs.

ONNX Runtime's own converter (`onnxruntime.transformers.float16`, shipped
with onnxruntime, so nothing is added) turns the float32 graph's weights and
ops to float16, keeping the ops it lists as unsafe in float16 in float32, and
keeps the inputs and outputs float32 (`keep_io_types`): clients, handlers and
the wire format see the same tensors as for the float32 graph.

Half precision pays on GPUs (tensor cores); on a CPU ONNX Runtime runs the
float16 ops it has kernels for and casts around the rest, so it is no faster
there. It is still verified here wherever the CPU provider runs it: export
tries, records `cpu_runs` and the reason when it cannot, and verify says so
plainly instead of passing.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys

import onnx
from torch import nn

from pipeline.core.errors import ExportError
from pipeline.core.noise import library_warnings
from pipeline.formats import reduced
from pipeline.formats.base import ExportContext, Format, register
from pipeline.formats.program import captured_output
from pipeline_runtime import formats
from pipeline_runtime.manifest import ArtifactRecord

log = logging.getLogger(__name__)

KEY = "onnx_fp16"
FILE = "model.fp16.onnx"


# Loads the graph in a child process: ONNX Runtime 1.2x's CPU provider does not just refuse
# some float16 graphs, it crashes on them (a segmentation fault creating the session of a
# float16 nn.LSTM tagger), which would take the whole export down with it.
_PROBE = (
    "import sys, onnxruntime as ort\n"
    "from pipeline_runtime.runners import ort_session_options\n"
    "try:\n"
    "    ort.InferenceSession(sys.argv[1], ort_session_options(1), "
    "providers=['CPUExecutionProvider'])\n"
    "except Exception as err:\n"
    "    print(' '.join(str(err).split())[:300] or type(err).__name__)\n"
    "    sys.exit(3)\n"
)


def cpu_problem(path: str) -> str:
    """Why ONNX Runtime's CPU provider cannot run the graph at `path`, or ""."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, path], capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return "ONNX Runtime's CPU provider took over 5 minutes to load it"
    if proc.returncode == 0:
        return ""
    if proc.returncode == 3:
        return proc.stdout.strip() or "refused"
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return f"ONNX Runtime's CPU provider crashed loading it ({name})"
    return " ".join((proc.stderr or "").split())[-300:] or f"exit status {proc.returncode}"


def export(model: nn.Module, ctx: ExportContext) -> ArtifactRecord:
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    source = reduced.float_onnx(model, ctx)
    log.info("ONNX float16…")
    path = ctx.out_dir / FILE
    what = "onnxruntime.transformers.float16"
    try:
        with library_warnings(what), captured_output(what):
            converted = OnnxModel(
                convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
            )
            # The converter appends the casts of the float32 inputs after the nodes that
            # read them; ONNX requires nodes in topological order (onnx.checker refuses it).
            converted.topological_sort(is_deterministic=True)
        onnx.save(converted.model, str(path))
    except Exception as err:  # noqa: BLE001 - the converter's failure is this format's
        raise ExportError(
            f"ONNX Runtime's float16 converter failed on {ctx.entry.name!r}: "
            f"{type(err).__name__}: {reduced.first_line(err)}"
        ) from None
    reduced.check_graph(path, "float16 ONNX")
    problem = cpu_problem(str(path))
    details = {
        "converter": {"tool": what, "keep_io_types": True},
        "from": str(ctx.cache.get("onnx_exporter", "the ONNX format's file")),
        "opset": ctx.opset,
        "cpu_runs": not problem,
    }
    if problem:
        # Written all the same: it is meant for GPU providers. Not judged here.
        log.warning(
            "ONNX Runtime's CPU provider cannot run the float16 graph of %s (%s): it is "
            "written unverified; verify it where a GPU provider runs it.",
            ctx.entry.name,
            problem,
        )
        details["cpu_problem"] = problem
    return reduced.record(
        ctx,
        key=KEY,
        path=path,
        precision="float16",
        reason="onnxruntime.transformers.float16 (float32 inputs and outputs, unsafe ops "
        "kept float32): for GPU execution providers",
        details=details,
    )


FORMAT = register(
    Format(
        key=KEY,
        title="ONNX float16",
        file=FILE,
        served_suffix="onnx_fp16",
        runner=formats.ONNXRUNTIME,
        backend="onnxruntime_fp16",
        platform="onnxruntime_onnx",
        export=export,
        default=False,
        precision="float16",
        description="float16 ONNX (float32 inputs/outputs) for GPU providers; ONNX Runtime",
    )
)
