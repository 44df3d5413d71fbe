"""Wire protocols: a served model's route, request bodies, request files and encodings.

A runtime declares the protocol it speaks (`Runtime.protocol`); clients, loadtest,
verify's served backends and bench's drivers speak to the protocol, never to the
runtime. Two exist: `OpenInference` (pipeline/serving/openinference.py: the Open Inference Protocol's REST
inference route, JSON and its binary tensor extension), which the KServe runtime and
any other OIP server share, and TorchServe's (`pipeline/runtimes/torchserve/
protocol.py`), whose `/predictions` route also takes images and NumPy files. The
split follows LitServe's `LitAPI`/`LitSpec` and KServe's `Model`/`InferRequest`: what
a model computes apart from how a request reaches it (../shared/STYLE.md).

A protocol object holds no server and no state: one instance serves every server
that speaks it. Heavy imports stay inside the methods (the CLI builds its help from
the runtimes, which hold their protocol).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import TooLargeError

if TYPE_CHECKING:
    import torch

    from pipeline.serving.server import Server
    from pipeline.serving.wire import Body


# verify's served requests (`Protocol.infer`) carry inputs of at least this many bytes in
# the protocol's binary form, smaller ones as JSON (what curl users send, so verify checks
# that path). A detector's 320×320 image is 1.2 MB of float32 but 6 MB of JSON text, which
# each end spent seconds writing and parsing; float32 crosses either form exactly.
BINARY_FROM_BYTES = 1 << 20


def wants_binary(inputs: Mapping[str, torch.Tensor]) -> bool:
    """Whether `inputs` are big enough for `infer` to send in the binary form."""
    return sum(t.numel() * t.element_size() for t in inputs.values()) >= BINARY_FROM_BYTES


def refused_answer(status: int, text: str) -> RuntimeError:
    """The error for a served answer that is not a 200."""
    error = TooLargeError if status == 413 else RuntimeError
    return error(f"HTTP {status}: {text[:300]}")


class Protocol(abc.ABC):
    """How requests reach a served model and what they carry."""

    name: str  # for people and for bench's peers: "oip", "torchserve"
    # loadtest's --encodings this protocol's servers read (None: every one loadtest knows).
    encodings: tuple[str, ...] | None = None
    # The ways `infer` reaches a server, the first the default: verify checks a served
    # model over each (pipeline.serving.backends), since each decodes on its own path.
    transports: tuple[str, ...] = ("rest",)

    def reads_binary(self) -> bool:
        """Whether this protocol's servers read its binary form (`encode(binary=True)`)."""
        return self.encodings is None or "npy" in self.encodings

    def ready_path(self, name: str) -> str | None:
        """The route that says whether served `name` can answer now (`pipeline status`
        asks it), or None where the protocol has none."""
        return None

    @abc.abstractmethod
    def infer_path(self, name: str, version: str | None = None) -> str:
        """The inference route of served `name` (of its `version`: None, the default's or
        the canary's share, as the server routes unversioned requests)."""

    @abc.abstractmethod
    def encode(self, inputs: Mapping[str, torch.Tensor], binary: bool = False) -> Body:
        """Named tensors as one request body (JSON, or the protocol's binary form)."""

    def encode_as(self, body: Body, content_type: str | None) -> Body:
        """`body` sent with another Content-Type (loadtest's untyped and form encodings);
        a protocol that fixes the type keeps `body`."""
        return body

    @abc.abstractmethod
    def decode(
        self, content: bytes, headers: Mapping[str, str] | None = None
    ) -> dict[str, torch.Tensor]:
        """An answer of this protocol's servers → its outputs by name; WireError for any
        other body (another protocol's answer included: a protocol reads its own answers
        and never guesses which protocol a body speaks)."""

    def answer(self, response: Any) -> dict[str, torch.Tensor]:
        """`decode` on an httpx response."""
        return self.decode(response.content, response.headers)

    @abc.abstractmethod
    def request_file(self, server: Server, name: str, path: Path) -> Body:
        """A request file (`pipeline infer`: an image, .json, .npy/.npz, .pt) as a body."""

    @abc.abstractmethod
    def infer(
        self,
        server: Server,
        name: str,
        inputs: Mapping[str, torch.Tensor],
        *,
        timeout: float = 120.0,
        version: str | None = None,
        transport: str = "rest",
    ) -> dict[str, torch.Tensor]:
        """One request to served `name` (its `version`'s route when given) over
        `transport` (one of `transports`), with the inference token and no resend
        (verify's served backends): the answer's outputs by name. Over REST, inputs of
        BINARY_FROM_BYTES or more go in the binary form where the server reads it, smaller
        ones as JSON. RuntimeError on any other answer than a success, saying it."""
