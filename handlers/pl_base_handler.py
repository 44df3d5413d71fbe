"""The template every pipeline handler follows (TorchServe's BaseHandler:
initialize → preprocess → inference → postprocess), with the parts that do
not depend on the artifact format. A subclass only loads its format
(`_load`) and runs a batch (`_forward`).

What it adds to TorchServe's template:
* the artifact's sha256 is checked against the archive's manifest before
  loading: a tampered file is refused and the model does not start;
* requests are decoded one by one; a bad request gets its own 4xx JSON answer
  and does not fail the rest of its batch;
* good requests with compatible shapes run as one forward pass and are split
  back, one answer per request (dynamic batching).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from ts.torch_handler.base_handler import BaseHandler

import pl_codec

logger = logging.getLogger(__name__)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def flatten_outputs(value: object) -> list[torch.Tensor]:
    """A model's outputs as a flat list: one tensor, or (nested) tuples/lists of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in flatten_outputs(v)]
    raise TypeError(f"unexpected model output {type(value).__name__}")


class PipelineHandler(BaseHandler):
    artifact_key = ""  # "torchscript" or "onnx": which manifest entry this handler serves

    def initialize(self, context: Any) -> None:
        props = context.system_properties
        self.model_dir = Path(props["model_dir"])
        self.model_name = context.manifest.get("model", {}).get("modelName", "model")
        self.manifest = json.loads((self.model_dir / "manifest.json").read_text(encoding="utf-8"))
        record = self.manifest["artifacts"][self.artifact_key]
        path = self.model_dir / record["file"]
        actual = sha256_file(path)
        if actual != record["sha256"]:
            raise RuntimeError(
                f"Refusing to serve {path.name}: its sha256 {actual} does not match the archive's "
                f"manifest ({record['sha256']}). The artifact was modified after export."
            )
        self.specs = [pl_codec.InputSpec.from_manifest(i) for i in self.manifest["inputs"]]
        self.output_names = [o["name"] for o in self.manifest["outputs"]]
        # Where each input's batch axis is: (seq, batch, features) inputs batch on axis 1.
        self.batch_axes = {
            s.name: s.shape.index("batch") if "batch" in s.shape else 0 for s in self.specs
        }
        serving = self.manifest.get("serving", {})
        self.image = serving.get("image")  # {"size": 28} for the digits CNN
        self.topk = int(serving.get("topk", 0))
        # Models whose output for one sample depends on the rest of the batch
        # (the tutorial gate sums over it) must not be stacked with other
        # clients' requests: each request then runs on its own.
        self.stack_requests = bool(serving.get("stack_requests", True)) and all(
            "batch" in s.shape for s in self.specs
        )  # an input without a batch axis (a shared scale, say) cannot be stacked
        self.output_batch_axes = [
            o["shape"].index("batch") if "batch" in o["shape"] else 0
            for o in self.manifest["outputs"]
        ]
        # One thread per worker unless told otherwise: several workers each
        # spinning several threads on a small machine collapse throughput.
        threads = int(
            os.environ.get("PIPELINE_WORKER_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        )
        torch.set_num_threads(max(1, threads))
        self.device = self._pick_device(props.get("gpu_id"))
        self._load(path)
        self.initialized = True
        self._warm_up()

    def _pick_device(self, gpu_id: Any) -> torch.device:
        if gpu_id is not None and torch.cuda.is_available():
            return torch.device(f"cuda:{int(gpu_id)}")
        if gpu_id is not None:
            logger.info("gpu_id=%s given but CUDA is not available; serving on CPU", gpu_id)
        return torch.device("cpu")

    def _warm_up(self) -> None:
        """Run the golden inputs once so the first real request is not the slow one."""
        golden = self.model_dir / "golden.pt"
        if not golden.is_file():
            return
        started = time.perf_counter()
        data = torch.load(golden, map_location="cpu", weights_only=True)
        self._forward({k: v.numpy() for k, v in data["inputs"].items()})
        logger.info("warm-up took %.1f ms", 1000 * (time.perf_counter() - started))

    # --- the template ---------------------------------------------------------

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[Any]:
        self.context = context
        decoded = self.preprocess(data)
        results = self.inference(decoded)
        return self.postprocess(results)

    def preprocess(
        self, data: list[dict[str, Any]]
    ) -> list[pl_codec.Decoded | pl_codec.RequestError]:
        out: list[pl_codec.Decoded | pl_codec.RequestError] = []
        for row in data:
            body = row.get("data") if row.get("data") is not None else row.get("body")
            try:
                if body is None and row:
                    # A form post: TorchServe turns its fields into the row's keys.
                    raise pl_codec.RequestError(
                        f"Got form fields {sorted(map(str, row))[:5]}; send the tensor JSON or the image "
                        "as the raw request body (Content-Type: application/json, image/png or image/jpeg).",
                        status=415,
                    )
                decoded = pl_codec.decode_request(
                    body, self.specs, accepts_images=self.image is not None
                )
                if decoded.protocol == "image":
                    decoded = self._image_inputs(decoded)
                out.append(decoded)
            except pl_codec.RequestError as err:
                out.append(err)
            except Exception as err:
                logger.exception("could not decode a request")
                out.append(
                    pl_codec.RequestError(
                        f"The request could not be decoded: {type(err).__name__}: {err}"
                    )
                )
        return out

    def _image_inputs(self, decoded: pl_codec.Decoded) -> pl_codec.Decoded:
        # The same resize as training (pipeline.data.preprocess_digits).
        name = self.specs[0].name
        x = torch.from_numpy(decoded.arrays[name])
        size = int(self.image["size"])
        if tuple(x.shape[-2:]) != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        return pl_codec.Decoded({name: x.contiguous().numpy()}, "image", unbatched=False)

    def inference(self, decoded: list[Any]) -> list[Any]:
        """Stack requests whose non-batch shapes agree; one forward per group.

        The batch axis is not always first: for (seq, batch, features) inputs a
        request's non-batch shape is compared over all other axes.
        """
        results: list[Any] = list(decoded)
        groups: dict[tuple, list[int]] = {}
        for i, item in enumerate(decoded):
            if isinstance(item, pl_codec.Decoded):
                key = tuple(
                    (
                        spec.name,
                        tuple(
                            d
                            for ax, d in enumerate(item.arrays[spec.name].shape)
                            if ax != self._batch_axis(spec)
                        ),
                    )
                    for spec in self.specs
                )
                groups.setdefault(key if self.stack_requests else (i,), []).append(i)
        for members in groups.values():
            batch = {
                spec.name: np.concatenate(
                    [decoded[i].arrays[spec.name] for i in members], axis=self._batch_axis(spec)
                )
                for spec in self.specs
            }
            if len(members) > 1:
                logger.info("dynamic batching: %d requests in one forward pass", len(members))
            try:
                outputs = self._forward(batch)
            except Exception as err:  # a runtime failure of this group only
                logger.exception("inference failed for %d request(s)", len(members))
                for i in members:
                    results[i] = pl_codec.RequestError(f"Inference failed: {err}", status=500)
                continue
            start = 0
            for i in members:
                n = decoded[i].arrays[self.specs[0].name].shape[self._batch_axis(self.specs[0])]
                parts = [
                    np.take(o, range(start, start + n), axis=ax)
                    for o, ax in zip(outputs, self.output_batch_axes, strict=False)
                ]
                results[i] = (decoded[i], parts if len(members) > 1 else outputs)
                start += n
        return results

    def _batch_axis(self, spec: pl_codec.InputSpec) -> int:
        return self.batch_axes[spec.name]

    def postprocess(self, results: list[Any]) -> list[Any]:
        answers = []
        for idx, item in enumerate(results):
            self.context.set_response_content_type(idx, "application/json")
            if isinstance(item, pl_codec.RequestError):
                # The phrase becomes the HTTP status line: one line of ASCII only.
                phrase = " ".join(str(item).split())[:200].encode("ascii", "replace").decode()
                self.context.set_response_status(item.status, phrase, idx)
                answers.append(item.to_json())
                continue
            decoded, outputs = item
            answers.append(
                pl_codec.encode_outputs(
                    self.output_names,
                    outputs,
                    decoded.protocol,
                    self.model_name,
                    decoded.unbatched,
                    self.topk,
                )
            )
        return answers

    # --- per format ----------------------------------------------------------

    def _load(self, path: Path) -> None:
        raise NotImplementedError

    def _forward(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError
