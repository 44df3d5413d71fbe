"""What a serving process must know of a format, torch-free: one descriptor per format.

A descriptor says which file an export holds for the format, which runner opens it
(`RUNNERS`: a TorchScript module, an AOTInductor package, an ONNX Runtime session),
its precision, whether the LibTorch C++ client runs it, and its Open Inference Protocol
`platform`. Everything that serves a format derives from it: the loader
(pipeline_runtime.runners), whether a worker can serve it without torch (ONNX Runtime
on numpy), the platform the KServe runtime's metadata reports, the TorchServe handler
an archive carries (generated from the key).

The built-in formats' descriptors are here, shipped in every archive and image. A
format registered elsewhere (pipeline.formats.register, a test's or a user's format)
adds its descriptor to this process with `add`, and its export writes the descriptor
into the artifact's manifest record (`RECORD_KEY`), so that a worker in another
process, which never imported that format's module, still knows how to run the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# How a file is opened: runners.LOADERS has one loader per kind.
TORCHSCRIPT, AOTI, ONNXRUNTIME = "torchscript", "aoti", "onnxruntime"
EXECUTORCH = "executorch"  # ExecuTorch's runtime: an on-device program, never served
RUNNERS = (TORCHSCRIPT, AOTI, ONNXRUNTIME, EXECUTORCH)
FLOAT32 = "float32"
RECORD_KEY = "descriptor"  # the artifact record's field that carries a descriptor


@dataclass(frozen=True)
class Descriptor:
    key: str  # the registry key and manifest artifact key: "onnx"
    file: str  # in the export folder: "model.onnx"
    runner: str  # one of RUNNERS
    precision: str = FLOAT32  # "float32", or "int8"/"float16" (judged by accuracy)
    cpp: bool = False  # the LibTorch C++ client runs it
    platform: str = ""  # the OIP metadata's platform ("onnxruntime_onnx")
    # False for an on-device format (ExecuTorch's .pte): verified and benchmarked here,
    # but no runtime archives, deploys or serves it.
    served: bool = True

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ValueError(
                f"format {self.key!r}: runner {self.runner!r} is not one of {', '.join(RUNNERS)}"
            )

    @property
    def torch_free(self) -> bool:
        """Whether a worker can run it on numpy, without importing torch (ONNX Runtime)."""
        return self.runner == ONNXRUNTIME

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Descriptor:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


BUILTIN: dict[str, Descriptor] = {
    d.key: d
    for d in (
        Descriptor(
            "torchscript",
            "model.torchscript.pt",
            TORCHSCRIPT,
            cpp=True,
            platform="pytorch_libtorch",
        ),
        Descriptor("onnx", "model.onnx", ONNXRUNTIME, platform="onnxruntime_onnx"),
        Descriptor("pt2", "model.pt2", AOTI, cpp=True, platform="pytorch_aoti"),
        # Reduced precision: int8 QDQ/integer ops or float16 inside, float32 at the edges.
        Descriptor(
            "onnx_int8_static",
            "model.int8_static.onnx",
            ONNXRUNTIME,
            "int8",
            platform="onnxruntime_onnx",
        ),
        Descriptor(
            "onnx_int8_dynamic",
            "model.int8_dynamic.onnx",
            ONNXRUNTIME,
            "int8",
            platform="onnxruntime_onnx",
        ),
        Descriptor(
            "onnx_fp16", "model.fp16.onnx", ONNXRUNTIME, "float16", platform="onnxruntime_onnx"
        ),
        # torchao's int8 Linear layers compiled into a .pt2: plain AOTInductor C++.
        Descriptor("pt2_int8", "model.int8.pt2", AOTI, "int8", cpp=True, platform="pytorch_aoti"),
        # On device: an ExecuTorch program (XNNPACK-delegated), run by its own runtime.
        Descriptor("pte", "model.pte", EXECUTORCH, served=False),
        Descriptor("pte_int8", "model.int8.pte", EXECUTORCH, "int8", served=False),
    )
}
_ADDED: dict[str, Descriptor] = {}


def add(descriptor: Descriptor) -> Descriptor:
    """Make a format registered outside this package known to this process."""
    known = BUILTIN.get(descriptor.key) or _ADDED.get(descriptor.key)
    if known is not None and known != descriptor:
        raise ValueError(f"format {descriptor.key!r} is already described as {known}")
    _ADDED[descriptor.key] = descriptor
    return descriptor


def remove(key: str) -> None:
    """Forget a format `add` made known (tests' own formats)."""
    if key in BUILTIN:
        raise ValueError(f"{key!r} is built in")
    _ADDED.pop(key, None)


class UnknownFormatError(KeyError):
    """A format no descriptor describes: not built in, not added, not in its record."""


def of(key: str, record: Mapping[str, Any] | None = None) -> Descriptor:
    """Format `key`'s descriptor: built in, added in this process, or the one its
    artifact's manifest record carries (`record`: the record's details)."""
    found = BUILTIN.get(key) or _ADDED.get(key)
    if found is not None:
        return found
    carried = (record or {}).get(RECORD_KEY)
    if isinstance(carried, Mapping):
        return Descriptor.from_json(carried)
    raise UnknownFormatError(
        f"No descriptor for format {key!r}: not built in ({', '.join(BUILTIN)}) and its "
        "manifest record carries none; re-export it with a pipeline that knows the format."
    )


def served(key: str, record: Mapping[str, Any] | None = None) -> bool:
    """Whether a server may serve format `key` (False for an on-device format, or one no
    descriptor describes)."""
    try:
        return of(key, record).served
    except UnknownFormatError:
        return False


def onnxruntime_keys() -> tuple[str, ...]:
    """The known formats ONNX Runtime runs (built in and added)."""
    return tuple(k for k, d in {**BUILTIN, **_ADDED}.items() if d.runner == ONNXRUNTIME)
