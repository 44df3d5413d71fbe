"""What a request asks of its answer: which outputs, each in JSON or binary (the Open
Inference Protocol's `outputs` and flags, `chosen`), and, for a request sent without its
batch axis, the answer without it (`unbatch`, every protocol). One rule for every runtime
(the KServe runtime's REST and gRPC routes, the Ray ingress, TorchServe's handler), the
outputs checked before the model runs, so a refusal costs no forward pass.

The protocol answers the outputs a request names in `outputs` (all of them when it names
none), in that order; the binary extension chooses JSON or binary per output
(`binary_data`, defaulting to the request's `binary_data_output`), and says both are
booleans. Refused, as the client's error: a name the model lacks, a flag that is not a
boolean (plain truthiness took the string "false" for true), and Triton's classification
extension (`classification: N`, tritonclient's `class_count`), which answers BYTES
"score:index" strings that pipeline_runtime.oip does not carry: answering the full tensor
instead was read as the top N.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pipeline_runtime.oip import Request

CLASSIFICATION = "classification"
# What the server metadata (`GET /v2`, gRPC ServerMetadata) lists: the protocol's extensions
# every OIP runtime here offers (Triton's name for the binary one). Not the model repository
# (versions change through the run folder) nor classification (refused, above).
EXTENSIONS = ["binary_tensor_data"]


class AskedError(ValueError):
    """What a request asks of its answer cannot be given (a 400; gRPC INVALID_ARGUMENT)."""


def chosen(
    asked: Iterable[tuple[str, Mapping[str, Any] | None]],
    names: Sequence[str],
    binary_default: Any = False,
) -> list[tuple[str, bool]]:
    """The outputs to answer, in order, each with whether it goes in binary: those `asked`
    (name, parameters), else every one of `names`; an output's `binary_data` defaults to
    `binary_default` (the request's `binary_data_output`). AskedError as the module says."""
    wanted = {name: parameters or {} for name, parameters in asked}
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise AskedError(f"No output named {unknown}; this model has {list(names)}.")
    default = flag(binary_default, "'binary_data_output'")
    plan = []
    for name in wanted or names:
        parameters = wanted.get(name, {})
        if CLASSIFICATION in parameters:
            raise AskedError(
                f"Output {name!r} asks for classification ({parameters[CLASSIFICATION]!r:.20}, "
                "tritonclient's class_count): the classification extension is not supported "
                "by this server. Ask for the output without class_count to get the full "
                "output tensor."
            )
        binary = parameters.get("binary_data", default)
        plan.append((name, flag(binary, f"'binary_data' of output {name!r}")))
    return plan


def plan(request: Request, names: Sequence[str]) -> list[tuple[str, bool]]:
    """`chosen` for an OIP request: its `outputs` and its `binary_data_output`."""
    asked = ((o["name"], o.get("parameters")) for o in request.outputs)
    return chosen(asked, names, request.parameters.get("binary_data_output", False))


def flag(value: Any, what: str) -> bool:
    """A binary extension flag: a boolean, or AskedError naming `what` and what it got."""
    if not isinstance(value, bool):
        raise AskedError(
            f"Parameter {what} must be true or false (a boolean); got {value!r:.40} "
            f"({type(value).__name__})."
        )
    return value


def unbatch(
    outputs: Sequence[np.ndarray], names: Sequence[str], per_sample: Sequence[str] = ()
) -> list[np.ndarray]:
    """The outputs of a request sent without its batch axis (one sample), without it: each
    output's first row; but a per-sample field (a detector's boxes, scores, labels) holds
    this one sample's rows along its detections axis, kept whole. Taking its first row
    answered one box of 300 while `counts` said 300, and failed on an image with none."""
    return [
        o if name in per_sample else (o[0] if o.ndim else o)
        for name, o in zip(names, outputs, strict=True)
    ]
