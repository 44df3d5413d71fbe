"""Backends that run an exported model from disk, each behind one small class.

Every backend takes the same named inputs and returns a flat list of output
tensors in manifest order, so `verify` compares them all the same way.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Protocol

import torch

from pipeline.compare import flatten_outputs
from pipeline.manifest import artifact_path
from pipeline.zoo.spec import Inputs


class Backend(Protocol):
    name: str

    def run(self, inputs: Inputs) -> list[torch.Tensor]: ...


class EagerBackend:
    """The reference: the checkpoint loaded into the zoo model, in eval mode."""

    name = "eager"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()

    @torch.inference_mode()
    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        return flatten_outputs(self.model(*inputs.values()))


class TorchScriptBackend:
    name = "torchscript"

    def __init__(self, export_dir: Path, manifest: dict[str, Any]) -> None:
        path = artifact_path(export_dir, manifest, "torchscript")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self.module = torch.jit.load(str(path), map_location="cpu")

    @torch.inference_mode()
    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        return flatten_outputs(self.module(*inputs.values()))


def ort_session_options(threads: int | None = None) -> Any:
    """ONNX Runtime options for sharing a process with PyTorch.

    Spinning threads off: with ORT's default spin-waiting, eager PyTorch in the
    same process ran about 12× slower on the reference 2-core machine
    (../shared/DESIGN.md).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, export_dir: Path, manifest: dict[str, Any]) -> None:
        import onnxruntime as ort

        path = artifact_path(export_dir, manifest, "onnx")
        self.session = ort.InferenceSession(
            str(path), ort_session_options(), providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        feed = {name: inputs[name].detach().cpu().numpy() for name in self.input_names}
        return [torch.from_numpy(a) for a in self.session.run(None, feed)]


class Pt2Backend:
    """The AOTInductor package, run in-process by `torch._inductor.aoti_load_package`."""

    name = "pt2"

    def __init__(self, export_dir: Path, manifest: dict[str, Any]) -> None:
        from pipeline.errors import ArtifactError
        from pipeline.export.pt2_export import load_package

        path = artifact_path(export_dir, manifest, "pt2")
        self.device = manifest["artifacts"]["pt2"].get("device", "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ArtifactError(
                f"{path} was compiled for CUDA and this machine has none; verify it on a GPU "
                "machine or re-export with --pt2-device cpu."
            )
        self.runner = load_package(path, self.device)

    @torch.inference_mode()
    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        # contiguous: the package checks strides against the exported ones
        outputs = self.runner(*(t.to(self.device).contiguous() for t in inputs.values()))
        return [t.cpu() for t in flatten_outputs(outputs)]


class TorchServeBackend:
    """A model served by a running TorchServe, reached over REST with its token."""

    def __init__(self, server: Any, archive: str, fmt: str, output_dtypes: list[str]) -> None:
        self.server = server
        self.archive = archive
        self.name = f"torchserve/{fmt}"
        self.dtypes = [getattr(torch, d) for d in output_dtypes]

    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        from pipeline.client import post, tensors_body

        resp = post(self.server, self.archive, tensors_body(inputs))
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        outputs = resp.json()["outputs"]
        return [
            torch.tensor(v, dtype=d) for v, d in zip(outputs.values(), self.dtypes, strict=True)
        ]


class CppBackend:
    """The LibTorch C++ client on the TorchScript artifact ("cpp") or the `.pt2` ("cpp/pt2").

    Starting the client costs LibTorch's load time, so `prepare` runs every
    case in one invocation and `run` hands back the stored outputs.
    """

    def __init__(
        self,
        export_dir: Path,
        manifest: dict[str, Any],
        binary: Path | None = None,
        artifact: str = "torchscript",
    ) -> None:
        from pipeline import cpp

        self.name = "cpp" if artifact == "torchscript" else f"cpp/{artifact}"
        self.model = artifact_path(export_dir, manifest, artifact)
        self.binary = Path(binary) if binary else cpp.ensure_built()
        self.results: dict[int, list[torch.Tensor]] = {}

    def prepare(self, cases: list[Inputs]) -> None:
        from pipeline import cpp

        done = cpp.run(self.model, [list(c.values()) for c in cases], binary=self.binary)
        self.results = {id(c): out for c, out in zip(cases, done.outputs, strict=True)}

    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        if id(inputs) in self.results:
            return self.results[id(inputs)]
        from pipeline import cpp

        return cpp.run(self.model, [list(inputs.values())], binary=self.binary).outputs[0]


BACKENDS: tuple[str, ...] = ("torchscript", "onnxruntime", "pt2", "cpp", "torchserve")
# Run by default: the in-process ones whose artifact the export has (the C++
# client and TorchServe on request or, for TorchServe, when a server for the
# model is running).
LOCAL_BACKENDS: tuple[str, ...] = ("torchscript", "onnxruntime", "pt2")
# backend → the manifest artifact it runs
ARTIFACT_OF = {"torchscript": "torchscript", "onnxruntime": "onnx", "pt2": "pt2"}
_FACTORIES = {
    "torchscript": TorchScriptBackend,
    "onnxruntime": OnnxRuntimeBackend,
    "pt2": Pt2Backend,
}
# The formats the C++ client runs, in the order their rows appear.
CPP_ARTIFACTS: tuple[str, ...] = ("torchscript", "pt2")


def local_backends(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The in-process backends for the artifacts this export holds."""
    return tuple(b for b in LOCAL_BACKENDS if ARTIFACT_OF[b] in manifest["artifacts"])


def load_backends(
    name: str, export_dir: Path, manifest: dict[str, Any], cpp_binary: Path | None = None
) -> list[Backend]:
    """`name`'s backends: one, or for "cpp" one per format the client runs."""
    if name == "cpp":
        found = [a for a in CPP_ARTIFACTS if a in manifest["artifacts"]]
        if not found:
            from pipeline.errors import ArtifactError

            raise ArtifactError(
                f"{export_dir} has no TorchScript or .pt2 artifact for the C++ client; export "
                "with --format torchscript or --format pt2."
            )
        return [CppBackend(export_dir, manifest, binary=cpp_binary, artifact=a) for a in found]
    return [_FACTORIES[name](export_dir, manifest)]


def served_backends(model: str, manifest: dict[str, Any], run_dir: Path | None) -> list[Backend]:
    """One backend per archive of `model` that the server in `run_dir` serves."""
    from pipeline.archive import FORMATS, archive_name
    from pipeline.serve import Server, default_run_dir

    server = Server.load(Path(run_dir or default_run_dir()))
    if not server.alive():
        from pipeline.serve import ServeError

        raise ServeError(
            f"The server recorded in {server.run_dir} is not running; start it with `pipeline serve`."
        )
    dtypes = [o["dtype"] for o in manifest["outputs"]]
    found = [
        TorchServeBackend(server, archive_name(model, fmt), fmt, dtypes)
        for fmt in FORMATS
        if archive_name(model, fmt) in server.models
    ]
    if not found:
        from pipeline.serve import ServeError

        raise ServeError(
            f"The running server does not serve {model}; archive it (`pipeline archive --model {model}`) "
            "and restart the server."
        )
    return found
