"""The backends verify compares with eager: one per registered format, plus the C++ client.

Every backend takes the same named inputs and returns a flat list of output
tensors in manifest order, so `verify` compares them all the same way. The
in-process ones are the formats' own Runners (`pipeline.formats`), loaded
exactly as bench and the TorchServe handlers load them. Served backends (any
runtime's, one per transport of its protocol) come from `pipeline.serving.backends`
and are handed to verify by its caller: verify does not depend on the serving stage.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from pipeline.core.errors import ArtifactError
from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.zoo.spec import Inputs
from pipeline_runtime.runners import Runner

CPP = "cpp"


class Backend(Protocol):
    """What verify checks: named inputs in, outputs out (named, or in manifest order).

    `format_key`: the format of the artifact it runs (None when unknown);
    `in_process`: whether verify can look inside it to localise a divergence.
    """

    name: str
    format_key: str | None
    in_process: bool

    def run(self, inputs: Inputs) -> Sequence[torch.Tensor] | Mapping[str, torch.Tensor]: ...


class RunnerBackend:
    """A format's Runner, in-process."""

    in_process = True

    def __init__(self, name: str, runner: Runner, format_key: str | None = None) -> None:
        self.name = name
        self.runner = runner
        self.format_key = format_key

    def run(self, inputs: Inputs) -> dict[str, torch.Tensor]:
        return self.runner(inputs)


@dataclass(frozen=True)
class Builds:
    """Where the C++ programs are built (None: each program's own folder under cpp_client/):
    the LibTorch client (`--cpp-build-dir`) and a format's own runner (`--pte-build-dir`)."""

    client: Path | None = None
    native: Path | None = None


class CppBackend:
    """A C++ program on a format it runs: the LibTorch client, "cpp" (TorchScript) or
    "cpp/<format>", or a format's own runner without LibTorch (`Format.native`: "cpp/pte").

    Starting the program costs its load time, so `prepare` runs every
    case in one invocation and `run` hands back the stored outputs.
    """

    in_process = False

    def __init__(
        self,
        exported: ExportedModel,
        fmt: registry.Format,
        binary: Path | None,
        device: str = "cpu",
        builds: Builds = Builds(),
    ) -> None:
        # `binary`: the LibTorch client's, built by the caller; else the program is built in
        # its folder of `builds` (a native runner, ExecuTorch's, in its own).
        self.program = importlib.import_module(fmt.native or "pipeline.formats.cpp")
        self.name = cpp_backend_name(fmt)
        self.format_key = fmt.key
        self.model = exported.path(fmt.key)
        # A package compiled for one kind of device runs there (the client refuses another);
        # a native runner (ExecuTorch's) runs on CPU whatever it is asked.
        compiled = exported.manifest.artifact(fmt.key).get("device")
        if fmt.native or compiled == "cpu":
            device = "cpu"
        elif compiled == "cuda" and not device.startswith("cuda"):
            device = "cuda:0"
        self.device = device
        if fmt.native:
            self.binary = self.program.ensure_built(builds.native)
        else:
            self.binary = Path(binary) if binary else self.program.ensure_built(builds.client)
        # Custom-op libraries (torchvision) the client must dlopen before the model.
        self.op_libraries = list(exported.manifest.artifact(fmt.key).get("op_libraries") or [])
        self.results: dict[int, list[torch.Tensor]] = {}

    def prepare(self, cases: list[Inputs]) -> None:
        done = self.program.run(
            self.model,
            [list(c.values()) for c in cases],
            binary=self.binary,
            device=self.device,
            op_libraries=self.op_libraries,
        )
        self.results = {id(c): out for c, out in zip(cases, done.outputs, strict=True)}

    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        if id(inputs) in self.results:
            return self.results[id(inputs)]
        return self.program.run(
            self.model,
            [list(inputs.values())],
            binary=self.binary,
            device=self.device,
            op_libraries=self.op_libraries,
        ).outputs[0]


def cpp_backend_name(fmt: registry.Format) -> str:
    """ "cpp" for the client's first format (TorchScript), "cpp/<key>" for the others."""
    first = next(f for f in registry.all_formats() if f.cpp)
    return CPP if fmt.key == first.key else f"{CPP}/{fmt.key}"


def backend_names() -> tuple[str, ...]:
    """The backends verify builds itself: each format's in-process backend and the C++
    client. Served backends (one prefix per runtime) are built by the caller."""
    return (*(f.backend for f in registry.all_formats()), CPP)


def local_backends(exported: ExportedModel) -> tuple[str, ...]:
    """The in-process backends for the artifacts this export holds (verify's default)."""
    return tuple(f.backend for f in exported.formats())


def load_backends(
    name: str,
    exported: ExportedModel,
    cpp_binary: Path | None = None,
    device: str = "cpu",
    builds: Builds = Builds(),
) -> list[Backend]:
    """`name`'s backends: one, or for "cpp" one per format the client runs that the export has,
    on `device` ("cpu", "cuda:N") where the format runs there. A program is built (in
    `builds`' folder) only when a format it runs is there."""
    if name == CPP:
        found = [f for f in exported.formats() if f.cpp or f.native]
        if not found:
            runnable = " or ".join(
                f"--format {f.key}" for f in registry.all_formats() if f.cpp or f.native
            )
            raise ArtifactError(
                f"{exported.dir} has no artifact the C++ client runs; export with {runnable}."
            )
        return [CppBackend(exported, f, cpp_binary, device, builds) for f in found]
    fmt = registry.by_backend(name)
    if fmt is None:
        raise ArtifactError(f"Unknown backend {name!r}; choose from {', '.join(backend_names())}.")
    if fmt.key in exported.manifest.unwritten:
        exported.path(fmt.key)  # raises, with the reason export recorded
    if fmt.key not in exported.manifest.artifacts:
        # Every format it holds too: an export replaces the folder (`--format pte_int8`
        # alone, as this said, deleted the model.pte beside it).
        held = [f.key for f in registry.all_formats() if f.key in exported.manifest.artifacts]
        flags = " ".join(f"--format {k}" for k in [*held, fmt.key])
        raise ArtifactError(
            f"The manifest in {exported.dir} has no {fmt.key!r} artifact for backend {name!r}; "
            f"re-run `pipeline export {flags}` (an export replaces the folder: name every "
            "format to keep)."
        )
    return [RunnerBackend(name, exported.load(fmt.key, device), fmt.key)]


def where(backend: Backend) -> str:
    """The device a backend ran on ("cpu", "cuda:0"); "" for a server's."""
    runner = getattr(backend, "runner", None)
    return str(runner.device) if runner is not None else getattr(backend, "device", "")
