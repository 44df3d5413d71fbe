"""The built-in runtimes' names, known without importing the registry or a runtime
package: the CLI's `--runtime` choices and help, and `Server.load` (a record written
before records named their runtime was TorchServe's, the first runtime there was).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Declared:
    """A runtime's names, known without importing its package."""

    name: str  # --runtime choice, server.json's runtime, backend prefix: "kserve"
    title: str  # for people: "the KServe runtime"


# The built-in runtimes, in order (the first is `pipeline serve`'s default). Each is
# pipeline/runtimes/<name>/, which registers a Runtime with these names (register() checks).
BUILTIN_RUNTIMES = (
    Declared("torchserve", "TorchServe"),
    Declared("kserve", "the KServe runtime"),
    Declared("ray", "the Ray Serve runtime"),
)
BUILTIN = tuple(d.name for d in BUILTIN_RUNTIMES)
