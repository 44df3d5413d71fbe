"""One exception base class; a small subclass per kind of failure.

The CLI catches `PipelineError` and prints its message (a paragraph naming the
file and what to do) instead of a traceback. Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A failure the user can act on. `str(err)` is the whole message."""

    exit_code = 1


class UnknownModelError(PipelineError):
    """A model name that is not in the zoo."""


class CheckpointError(PipelineError):
    """A checkpoint that is missing, unreadable, or not what it claims to be."""


class ArtifactError(PipelineError):
    """An exported artifact or manifest that is missing or does not match."""


class ExportError(PipelineError):
    """An export that could not produce a faithful artifact."""


class InputSpecError(PipelineError):
    """Inputs whose names, shapes or dtypes do not match the model's spec."""


class InputArgumentError(InputSpecError):
    """--input/--output/--model-kwargs missing where the model needs them, or given where it
    takes none: bad arguments, exit status 2 (as argparse's own), not a failed export."""

    exit_code = 2


class ParityError(PipelineError):
    """One or more backends disagree with eager PyTorch beyond tolerance."""


# The kinds of parity failure, as optimum's exporters type theirs (ShapeError,
# AtolError, OutputMatchError), so that a caller can catch the one it handles.
class ShapeMismatchError(ParityError):
    """A backend's output has another shape or dtype than eager's."""


class ToleranceError(ParityError):
    """A backend's values differ from eager's beyond atol + rtol * |ref|."""


class MissingOutputError(ParityError):
    """A backend did not return one of the outputs the manifest names."""


class NonFiniteOutputError(ParityError):
    """NaN or Inf in a backend's output (or in the eager reference)."""


class VacuousToleranceError(ParityError):
    """The tolerance cannot tell the reference from zeros, so the check proves nothing."""


class BackendCrashError(ParityError):
    """A backend raised instead of answering."""


class ExportRequestError(ExportError):
    """An export setting that cannot be honoured (--method trace refused, --pt2-device cuda
    without CUDA). Unlike a format that cannot express the model, which the export records
    and skips, this stops the whole export: the user asked for exactly this."""


class TooLargeError(RuntimeError):
    """A server refused a request as over its body limit (HTTP 413, gRPC
    RESOURCE_EXHAUSTED): a case verify could not send, not a wrong answer (verify/check.py).
    Raised by the serving protocols; here so that verify, an earlier stage, can catch it."""
