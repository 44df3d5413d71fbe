"""TorchScript export that never silently keeps a wrong trace.

`torch.jit.trace` records only the path the example input took; on
data-dependent control flow it prints a `TracerWarning` and returns a graph
that is wrong for inputs taking the other branch. Here tracing is held to a
higher bar: `TracerWarning` is an error, `check_inputs` are the zoo entry's
probe inputs (chosen to drive every branch), and the traced module must match
eager on every probe. A trace that fails any of that is rejected with the
reason, and `auto` scripts the model instead.
"""

from __future__ import annotations

import linecache
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from pipeline.compare import compare_outputs, flatten_outputs
from pipeline.errors import ExportError
from pipeline.zoo.spec import Inputs

Method = Literal["auto", "trace", "script"]
METHODS: tuple[str, ...] = ("auto", "trace", "script")


@dataclass(frozen=True)
class ScriptResult:
    module: torch.jit.ScriptModule
    method: str  # "trace" or "script"
    reason: str  # why this method, in words a user can act on


def _where(w: warnings.WarningMessage) -> str:
    """'file.py:LINE (source)' of a recorded warning: the model's own line, since
    the tracer warns from inside the Python frame that converted the tensor."""
    line = linecache.getline(w.filename, w.lineno).strip()
    return f"{w.filename}:{w.lineno}" + (f" ({line})" if line else "")


def _first_line(err: BaseException | Warning | str) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def try_trace(
    model: nn.Module,
    example: Inputs,
    probes: list[tuple[str, Inputs]],
    atol: float,
    rtol: float,
) -> tuple[torch.jit.ScriptModule | None, str]:
    """Trace strictly. Returns (module, "") or (None, why it was rejected).

    TracerWarnings are recorded rather than raised: a warning raised from the
    C++ tracer surfaces as an opaque SystemError, while a recorded one keeps
    the file and line of the model code that caused it.
    """
    check_inputs = [tuple(p.values()) for _, p in probes] or None
    failure = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        # The deprecation FutureWarning of torch.jit is expected; see DESIGN.md.
        warnings.simplefilter("ignore", FutureWarning)
        try:
            traced = torch.jit.trace(
                model,
                tuple(example.values()),
                check_inputs=check_inputs,
                check_tolerance=atol,
                strict=True,
            )
        except torch.jit.TracingCheckError as err:
            traced, failure = (
                None,
                f"re-tracing the probe inputs gave a different graph or output ({_first_line(err)})",
            )
        except Exception as err:  # noqa: BLE001 - any tracing failure is a reason to script
            traced, failure = (
                None,
                f"torch.jit.trace raised {type(err).__name__}: {_first_line(err)}",
            )
    tracer_warnings = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    if tracer_warnings:
        first = tracer_warnings[0]
        more = f" (and {len(tracer_warnings) - 1} more)" if len(tracer_warnings) > 1 else ""
        return (
            None,
            f"trace rejected: TracerWarning at {_where(first)}, {_first_line(first.message).split('. ')[0]!r}{more}",
        )
    if traced is None:
        return None, f"trace rejected: {failure}"

    with torch.no_grad():
        for label, probe in probes:
            expected = flatten_outputs(model(*probe.values()))
            actual = flatten_outputs(traced(*probe.values()))
            worst = compare_outputs(expected, actual, atol=atol, rtol=rtol)
            if worst is not None:
                return (
                    None,
                    f"trace rejected: traced output differs from eager on probe {label!r} ({worst})",
                )
    return traced, ""


def try_script(model: nn.Module) -> tuple[torch.jit.ScriptModule | None, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return torch.jit.script(model), ""
    except Exception as err:  # noqa: BLE001 - TorchScript's frontend raises many types
        return None, f"script failed: {type(err).__name__}: {_first_line(err)}"


def to_torchscript(
    model: nn.Module,
    example: Inputs,
    probes: list[tuple[str, Inputs]],
    *,
    method: Method = "auto",
    allow_unsafe_trace: bool = False,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> ScriptResult:
    """Convert an eval-mode model to TorchScript with the safest method that works."""
    if method not in METHODS:
        raise ExportError(f"Unknown method {method!r}; use one of {', '.join(METHODS)}.")
    if method == "script":
        scripted, why = try_script(model)
        if scripted is None:
            raise ExportError(f"--method script failed: {why}. Try --method auto.")
        return ScriptResult(scripted, "script", "scripted because --method script was given")

    traced, rejected = try_trace(model, example, probes, atol, rtol)
    if traced is not None:
        return ScriptResult(
            traced,
            "trace",
            f"traced: no TracerWarning, and the trace matched eager on all {len(probes)} probe inputs",
        )
    if method == "trace":
        if not allow_unsafe_trace:
            raise ExportError(
                f"--method trace refused: {rejected}. The model has data-dependent behaviour "
                "that a trace would bake in. Use --method auto or --method script, or pass "
                "--allow-unsafe-trace to keep the trace anyway (verify will show the mismatch)."
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            unsafe = torch.jit.trace(model, tuple(example.values()), check_trace=False)
        return ScriptResult(
            unsafe, "trace", f"UNSAFE trace kept by --allow-unsafe-trace; {rejected}"
        )

    scripted, script_failed = try_script(model)
    if scripted is None:
        raise ExportError(
            f"No faithful TorchScript for this model: {rejected}; {script_failed}. "
            "Make the model scriptable (type-annotate or move Python-only code out of forward)."
        )
    return ScriptResult(scripted, "script", f"{rejected}; scripted")
