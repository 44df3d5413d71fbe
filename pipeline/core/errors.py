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


class ParityError(PipelineError):
    """One or more backends disagree with eager PyTorch beyond tolerance."""
