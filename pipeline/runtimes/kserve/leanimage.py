"""The torch-free deploy image (issue 40): for ONNX and its int8/float16 variants,
`pipeline deploy kserve` installs the project without its dependencies and then only
the `serve-onnx` extra of pyproject.toml: kserve, ONNX Runtime, the tracing SDK and
what the runtime's modules import, never torch.

The extra is the one list: deploy copies it into the image as a requirements file, and
a test checks that the ONNX worker's imports all come from it (its installed closure).
Sizes are what the two dependency sets occupy installed on this machine (no Docker
daemon is needed to write the folder); an image adds its base (python:3.11-slim) to each.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from pipeline_runtime.manifest import Manifest

EXTRA = "serve-onnx"
REQUIREMENTS_FILE = "requirements-serve-onnx.txt"


def lean(fmt: str, manifest: Manifest) -> bool:
    """Whether the image for `fmt` of this export can leave torch out: exactly when the
    runtime's worker loads it without torch (loading.lean: its descriptor's runner needs
    none, the manifest's record carrying it for a format this process does not know, and
    the export holds the torch-free warm-up inputs). An older export without them is
    served through torch, so its image keeps torch. ArtifactError for a format without a
    descriptor (deploy checks the format against the registry first)."""
    from pipeline.serving.loading import lean as served_lean

    return served_lean(fmt, manifest)


def requirements(pyproject: Path, extra: str | None = EXTRA) -> list[str]:
    """The extra's requirement lines (None: the project's own dependencies)."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    if extra is None:
        return list(project["dependencies"])
    return list(project["optional-dependencies"][extra])


def normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def closure(lines: list[str]) -> set[str]:
    """Every installed distribution `lines` need, with theirs (normalised names; markers
    evaluated for this machine, extras followed)."""
    seen: set[str] = set()
    todo = [Requirement(line) for line in lines]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = normalise(req.name)
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # not installed here (another platform's); not counted
        for line in dist.requires or ():
            sub = Requirement(line)
            wanted = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in wanted):
                todo.append(sub)
    return {k.split("[")[0] for k in seen}


def installed_mb(names: set[str]) -> float:
    """What the distributions occupy on this machine's disk, in MB."""
    total = 0
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for f in dist.files or ():
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                total += path.stat().st_size
    return total / 2**20


@dataclass(frozen=True)
class Sizes:
    lean_mb: float  # the serve-onnx extra, installed
    full_mb: float  # the project's dependencies, installed (torch and its CUDA libraries)

    def describe(self) -> str:
        return (
            f"image packages as installed here: torch-free {self.lean_mb:,.0f} MB "
            f"(the {EXTRA} extra) against {self.full_mb:,.0f} MB with torch "
            f"(each plus the python:3.11-slim base)"
        )


def sizes(pyproject: Path) -> Sizes:
    return Sizes(
        installed_mb(closure(requirements(pyproject))),
        installed_mb(closure(requirements(pyproject, None))),
    )
