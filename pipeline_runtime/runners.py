"""Loading an exported artifact: one loader per format, one Runner contract.

A `Runner` takes named tensors and returns named tensors (the manifest's
names, in its order), whatever the format. verify, bench and the TorchServe
handlers all load through `load()`, so a format is loaded in exactly one way:
same device rules, same thread settings, same input checks.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline_runtime import formats, jitgate, oplibs, ortsession
from pipeline_runtime.ortsession import ProviderError  # noqa: F401 - callers import it here
from pipeline_runtime.outputs import name_outputs

log = logging.getLogger(__name__)

Tensors = Mapping[str, torch.Tensor]

# AOTInductor's generated code trusts its inputs: a wrong shape, dtype or a
# size disagreeing with another input's can read out of bounds (a `my_cell`
# package called with x of batch 2,000,000 and h of batch 1 segfaulted). With
# this set before loading, the package checks sizes, strides and dtypes and
# raises instead. Inherited by TorchServe workers and the C++ client.
CHECK_INPUTS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"


class LoadError(RuntimeError):
    """An artifact that cannot run here (wrong device kind, unreadable file)."""


@dataclass
class Runner:
    """An artifact ready to run: named tensors in, named tensors out (on CPU)."""

    format: str
    device: torch.device
    input_names: list[str]
    output_names: list[str]
    call: Callable[[list[torch.Tensor]], Any]  # inputs in forward() order → raw outputs
    # What it was loaded with (threads, providers, ...), for reports.
    settings: dict[str, Any]

    def __call__(self, inputs: Tensors) -> dict[str, torch.Tensor]:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise ValueError(f"missing input(s) {missing}; the model takes {self.input_names}")
        ordered = [inputs[n] for n in self.input_names]
        outputs = name_outputs(self.call(ordered), self.output_names)
        return {k: v.detach().cpu() for k, v in outputs.items()}

    def positional(self, *args: torch.Tensor) -> Any:
        """The raw call, inputs in forward() order: for timing without the naming."""
        return self.call(list(args))


def ort_session_options(threads: int | None = None) -> Any:
    """ONNX Runtime options (ortsession.session_options), `threads` None: torch's count."""
    return ortsession.session_options(threads or torch.get_num_threads())


def load_torchscript(
    path: Path, device: torch.device, threads: int | None, record: Mapping[str, Any]
) -> tuple[Callable[[list[torch.Tensor]], Any], torch.device, dict[str, Any]]:
    # Custom operators (torchvision::nms) must be registered before the file is read.
    try:
        oplibs.load_op_libraries(record.get(oplibs.OP_LIBRARIES_KEY) or ())
    except oplibs.OpLibraryError as err:
        raise LoadError(f"{Path(path).name}: {err}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation: DESIGN.md
            module = torch.jit.load(str(path), map_location=device).eval()
    except RuntimeError as err:
        if not jitgate.is_refusal(err):
            raise
        raise LoadError(
            jitgate.refusal_message(f"{Path(path).name} (TorchScript) cannot be loaded")
            + " Serve or verify this export's ONNX or .pt2 instead."
        ) from None

    def call(args: list[torch.Tensor]) -> Any:
        with torch.inference_mode():
            return module(*(t.to(device) for t in args))

    call.module = module  # type: ignore[attr-defined]  # bench freezes it
    return call, device, {"intra_op_threads": threads or torch.get_num_threads()}


def load_onnx(
    path: Path, device: torch.device, threads: int | None, record: Mapping[str, Any]
) -> tuple[Callable[[list[torch.Tensor]], Any], torch.device, dict[str, Any]]:
    cuda = (device.index or 0) if device.type == "cuda" else None
    session, on_cuda = ortsession.open_session(
        path, cuda, threads or torch.get_num_threads(), record
    )
    if not on_cuda:
        device = torch.device("cpu")
    names = [i.name for i in session.get_inputs()]

    def call(args: list[torch.Tensor]) -> list[torch.Tensor]:
        feed = {n: t.detach().cpu().numpy() for n, t in zip(names, args, strict=True)}
        return [torch.from_numpy(a) for a in session.run(None, feed)]

    call.session = session  # type: ignore[attr-defined]  # bench converts its opset
    return call, device, ortsession.settings_of(session)


def load_pt2(
    path: Path, device: torch.device, threads: int | None, record: Mapping[str, Any]
) -> tuple[Callable[[list[torch.Tensor]], Any], torch.device, dict[str, Any]]:
    compiled_for = str(record.get("device", "cpu"))
    if compiled_for == "cuda" and device.type != "cuda":
        if not torch.cuda.is_available():
            raise LoadError(
                f"{Path(path).name} was compiled by AOTInductor for CUDA and there is no CUDA "
                "here. Run it on a GPU machine, or re-export with --pt2-device cpu."
            )
        log.info("%s was compiled for CUDA: running it on cuda:0", Path(path).name)
        device = torch.device("cuda:0")
    elif compiled_for == "cpu" and device.type == "cuda":
        log.info(
            "%s was compiled for CPU: running it on CPU, not %s (export with --pt2-device cuda "
            "for a GPU package)",
            Path(path).name,
            device,
        )
        device = torch.device("cpu")
    os.environ.setdefault(CHECK_INPUTS_ENV, "1")  # see CHECK_INPUTS_ENV
    # -1: the package's own device (CPU, or cuda:0 for a CUDA package); N: cuda:N.
    index = device.index if device.type == "cuda" and device.index is not None else -1
    call = lean_call(aoti_load(path, index), device)
    return (
        call,
        device,
        {"intra_op_threads": threads or torch.get_num_threads(), "call": "boxed_run"},
    )


def lean_call(package: Any, device: torch.device) -> Callable[[list[torch.Tensor]], Any]:
    """The package's loader called directly, its output structure parsed once.

    `AOTICompiledModel.__call__` re-reads and re-parses the package's call spec and
    pytree-flattens the inputs and outputs on every call: 6.5 µs of a 12 µs call on a tiny
    model, and the garbage it leaves triggered the GC passes behind its ~70 µs p99
    (docs/export.md, ".pt2 from Python"). The package's own input check (CHECK_INPUTS_ENV)
    still holds every input's shape, dtype and strides.
    """
    import torch.utils._pytree as pytree

    run = package.loader.boxed_run  # empties the list it is given: a new list each call
    spec = pytree.treespec_loads(package.loader.get_call_spec()[1])
    leaf = spec.is_leaf()

    def call(args: list[torch.Tensor]) -> Any:
        # contiguous: the package's input check holds strides to the exported ones
        flat = [t.to(device).contiguous() for t in args]
        with torch.inference_mode():
            out = run(flat)
        return out[0] if leaf else pytree.tree_unflatten(out, spec)

    return call


def aoti_load(path: Path, device_index: int = -1) -> Any:
    """`torch._inductor.aoti_load_package`, quietly, with the input check on."""
    import contextlib
    import io

    os.environ.setdefault(CHECK_INPUTS_ENV, "1")
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch._inductor.aoti_load_package(str(path), device_index=device_index)


def load_executorch(
    path: Path, device: torch.device, threads: int | None, record: Mapping[str, Any]
) -> tuple[Callable[[list[torch.Tensor]], Any], torch.device, dict[str, Any]]:
    from pipeline_runtime import etprogram

    if device.type != "cpu":
        log.info("%s is an on-device (CPU) program: running it on CPU", Path(path).name)
    try:
        call = etprogram.open_method(path, record)
    except etprogram.ProgramError as err:
        raise LoadError(str(err)) from None
    # ExecuTorch's XNNPACK delegate sizes its own thread pool (the machine's cores).
    return (
        call,
        torch.device("cpu"),
        {"runtime": f"executorch {etprogram.version()}", "backend": record.get("backend")},
    )


# One loader per runner kind (pipeline_runtime.formats.RUNNERS); a format's descriptor
# names its kind, so a new format of a known kind needs no loader of its own.
LOADERS: dict[
    str, Callable[..., tuple[Callable[[list[torch.Tensor]], Any], torch.device, dict]]
] = {
    formats.TORCHSCRIPT: load_torchscript,
    formats.AOTI: load_pt2,
    # ONNX graphs like any other, int8 QDQ/integer ops or float16 inside, float32 at their
    # edges (the reduced-precision variants).
    formats.ONNXRUNTIME: load_onnx,
    formats.EXECUTORCH: load_executorch,
}


def full_float32() -> None:
    """Float32 on CUDA computed in float32: TF32 off for cuDNN and cuBLAS, process-wide.

    A float32 artifact is held to its export's golden outputs (computed on CPU) at
    1e-4. Whether cuDNN takes TF32 for a convolution depends on the algorithm it picks:
    on an H200 the digits CNN served in the test process missed its golden logits by
    2e-3, where a fresh process matched (2026-11-28). The float16 variants are the fast
    path on a GPU.

    The legacy switches, not the `fp32_precision` settings: with those set, torch's own
    `cudnn.flags()` (torch.export enters it) refuses to read the TF32 state (torch 2.11
    and 2.14).
    """
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def load(
    fmt: str,
    path: Path,
    *,
    inputs: Sequence[str],
    outputs: Sequence[str],
    device: str | torch.device = "cpu",
    threads: int | None = None,
    record: Mapping[str, Any] | None = None,
) -> Runner:
    """Load artifact `path` of format `fmt` as a Runner on `device`.

    `threads` sizes ONNX Runtime's own pool and is recorded in the settings;
    torch's process-wide thread count is the caller's to set (a TorchServe
    worker sets it once, bench per measurement), never a loader's.
    `record` is the artifact's manifest record (the .pt2's compiled device lives there).
    """
    try:
        loader = LOADERS[formats.of(fmt, record).runner]
    except formats.UnknownFormatError as err:
        raise LoadError(str(err.args[0])) from None
    call, used, settings = loader(Path(path), torch.device(device), threads, record or {})
    if used.type == "cuda":
        full_float32()
    return Runner(fmt, used, list(inputs), list(outputs), call, settings)
