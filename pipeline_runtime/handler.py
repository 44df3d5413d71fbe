"""The TorchServe handler every format's archive runs, on BaseHandler's template.

`BaseHandler.handle` stays as TorchServe wrote it (it sets `self.context`,
answers `describe` requests, runs preprocess → inference → postprocess and
records `HandlerTime`); this class fills in the steps:

* `initialize`: reads the archive's `manifest.json`, refuses an artifact whose
  sha256 differs from it (the model then does not start), loads the artifact
  through `pipeline_runtime.runners` (the loader verify and bench use: same
  device rules, same threads), warms it up on `golden.pt` and, with `pipeline serve
  --shadow`, starts the worker's shadow check (handlershadow.py);
* `preprocess`: decodes each request on its own (`pipeline_runtime.codec`),
  within `max_samples` samples and `MAX_INPUT_BYTES` of inputs (checked from
  .npy/.npz headers before anything is read); a bad one becomes its own 4xx
  JSON answer and does not fail its batch;
* `inference`: runs requests with compatible shapes as one forward pass and
  splits the outputs back (dynamic batching), unless the model says its
  samples depend on each other;
* `postprocess`: one JSON answer per request (tensors, top-k, or the Open
  Inference Protocol), with its own HTTP status;
* `describe_handle`: the model's I/O contract, for TorchServe's
  `GET /models/<name>?customized=true`.

A format's handler, `<key>_handler.py`, only names its format key: `pipeline archive`
writes it into each archive (pipeline.runtimes.torchserve.archive.handler_source), and
the format's descriptor (pipeline_runtime.formats) picks the loader.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
import torch.nn.functional as F
from ts.handler_utils.timer import timed
from ts.torch_handler.base_handler import BaseHandler

from pipeline_runtime import (
    bounded,
    codec,
    failure,
    handlershadow,
    handlertrace,
    responses,
    runners,
)
from pipeline_runtime.files import IntegrityError, check_sha256
from pipeline_runtime.manifest import MANIFEST_NAME, Manifest, TensorRecord
from pipeline_runtime.request import MAX_SAMPLES_ENV, SAMPLES_PER_BATCH

logger = logging.getLogger(__name__)

GOLDEN_FILE = "golden.pt"  # the archive's warm-up inputs
# Intra-op threads per worker; `pipeline serve` sets both. One when unset:
# several workers each spinning several threads on a small machine collapse throughput.
THREADS_ENV = ("PIPELINE_WORKER_THREADS", "OMP_NUM_THREADS")

# One request after `inference`: its error, or its decoded inputs and outputs.
Result = codec.RequestError | tuple[codec.Decoded, list[np.ndarray]]


def worker_threads() -> int:
    for name in THREADS_ENV:
        if os.environ.get(name):
            return max(1, int(os.environ[name]))
    return 1


def max_samples(batch_size: int, handler_config: Any = None) -> int:
    """How many samples one request may carry.

    `PIPELINE_MAX_SAMPLES` in the server's environment (workers inherit it),
    else `handler: {max_samples: N}` in the archive's model-config.yaml, else
    `SAMPLES_PER_BATCH` times the archive's TorchServe batch size.
    """
    config = handler_config if isinstance(handler_config, dict) else {}
    for source, value in (
        (MAX_SAMPLES_ENV, os.environ.get(MAX_SAMPLES_ENV)),
        ("max_samples in model-config.yaml", config.get("max_samples")),
    ):
        if value is None or value == "":
            continue
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or isinstance(value, bool | float):
            raise ValueError(
                f"{source} must be a whole number of samples, at least 1; got {value!r}."
            )
        return n
    return SAMPLES_PER_BATCH * max(1, int(batch_size or 1))


# TorchServe's Java frontend decodes these bodies itself and hands the handler
# their fields (or nothing, for a body without '='): the body is lost by then.
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _where(device: torch.device) -> str:
    return "CPU" if device.type == "cpu" else str(device)


class PipelineHandler(BaseHandler):
    format_key = ""  # the format registry key this handler serves: "torchscript", "onnx", "pt2"

    def initialize(self, context: Any) -> None:
        props = context.system_properties
        self.model_dir = Path(props["model_dir"])
        self.model_name = context.model_name or "model"
        # The archive's version, which OIP answers name (the KServe and Ray runtimes' do).
        self.model_version = (context.manifest or {}).get("model", {}).get("modelVersion")
        # Not `self.manifest`: BaseHandler keeps TorchServe's MANIFEST.json dict there.
        self.contract = Manifest.loads((self.model_dir / MANIFEST_NAME).read_bytes())
        record = self.contract.artifact(self.format_key)
        path = self.model_dir / record.file
        try:
            check_sha256(path, record.sha256)
        except IntegrityError as err:
            raise IntegrityError(f"Refusing to serve {record.file}: {err}") from None
        serving = self.contract.serving
        self.specs: tuple[TensorRecord, ...] = self.contract.input_specs(self.format_key)
        self.image_size = serving.image_size
        self.topk = serving.topk
        # An input without a batch axis (a shared scale, say) cannot be stacked either.
        self.stack_requests = serving.stack_requests and all(
            s.batch_axis is not None for s in self.specs
        )
        self.output_axes = [o.batch_axis or 0 for o in self.contract.outputs]
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.limits = codec.Limits(
            max_samples=max_samples(props.get("batch_size", 1), yaml_config.get("handler")),
            max_axes=bounded.axis_bounds(self.contract, self.format_key),
        )
        logger.info(
            "requests take at most %d samples and %d bytes of inputs",
            self.limits.max_samples,
            self.limits.max_bytes,
        )
        wanted = self._pick_device(props.get("gpu_id"))
        threads = worker_threads()
        # One thread per worker unless told otherwise: several workers each
        # spinning several threads on a small machine collapse throughput.
        torch.set_num_threads(threads)
        self.runner = runners.load(
            self.format_key,
            path,
            inputs=self.contract.input_names,
            outputs=self.contract.output_names,
            device=wanted,
            threads=threads,
            record=record.details,
        )
        self.device = self.runner.device
        # Stacked requests past a .pt2's bounded batch go in passes it takes (bounded.py).
        self._forward = bounded.within_bound(
            self._forward,
            {s.name: s.batch_axis for s in self.specs},
            self.output_axes,
            bounded.batch_bound(self.contract, self.format_key),
        )
        if self.device != wanted:  # a .pt2 compiled for the other device kind, ORT without CUDA
            compiled = record.get("device")
            why = f"was compiled for {str(compiled).upper()}" if compiled else "cannot run there"
            logger.info(
                "%s %s: serving it on %s, not %s", path.name, why, _where(self.device), wanted
            )
        self.initialized = True
        self._warm_up()
        self.traced = handlertrace.install(self)  # after the warm-up: it is no request
        # `pipeline serve --shadow`: samples of the answers re-checked beside the worker.
        self.shadow = handlershadow.install(self, context)

    def handle(self, data: list[dict[str, Any]], context: Any) -> Any:
        """BaseHandler's template; then, with tracing on, the batch's spans."""
        answers = super().handle(data, context)
        if self.traced:
            handlertrace.emit(self, len(data), context, self.model_name)
        return answers

    def _pick_device(self, gpu_id: Any) -> torch.device:
        if gpu_id is not None and torch.cuda.is_available():
            return torch.device(f"cuda:{int(gpu_id)}")
        if gpu_id is not None:
            logger.info("gpu_id=%s given but CUDA is not available; serving on CPU", gpu_id)
        return torch.device("cpu")

    def _warm_up(self) -> None:
        """Run the golden inputs once so the first real request is not the slow one."""
        golden = self.model_dir / GOLDEN_FILE
        if not golden.is_file():
            return
        started = time.perf_counter()
        data = torch.load(golden, map_location="cpu", weights_only=True)
        self._forward(
            codec.warm_up_inputs({k: v.numpy() for k, v in data["inputs"].items()}, self.specs)
        )
        logger.info("warm-up took %.1f ms", 1000 * (time.perf_counter() - started))

    def _forward(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self.runner({k: torch.from_numpy(v) for k, v in batch.items()})
        return [t.numpy() for t in outputs.values()]

    # --- the template's steps -------------------------------------------------

    @timed
    def preprocess(self, data: list[dict[str, Any]]) -> list[codec.Decoded | codec.RequestError]:
        out: list[codec.Decoded | codec.RequestError] = []
        for idx, row in enumerate(data):
            body = row.get("data") if row.get("data") is not None else row.get("body")
            try:
                if body is None and (row or self._content_type(idx) in FORM_TYPES):
                    # A form post: TorchServe turns its fields into the row's keys, and
                    # drops a body without '=' (JSON, most images) altogether.
                    raise codec.RequestError(
                        f"Got form fields {sorted(map(str, row))[:5]}: TorchServe decodes a body "
                        "sent as application/x-www-form-urlencoded (curl's default for "
                        "--data-binary) or multipart/form-data into fields. Send the JSON, "
                        ".npy/.npz or image as the raw body with its own Content-Type "
                        "(application/json, application/octet-stream, image/png, image/jpeg), "
                        "or through the gateway, which recognises the body by its content.",
                        status=415,
                    )
                decoded = codec.decode_request(
                    body,
                    self.specs,
                    accepts_images=self.image_size is not None,
                    limits=self.limits,
                    outputs=self.contract.output_names,
                )
                if decoded.protocol == "image":
                    decoded = self._image_inputs(decoded)
                out.append(decoded)
            except codec.RequestError as err:
                out.append(err)
            except Exception as err:  # any decoding bug is this request's 400 only (logged)
                logger.exception("could not decode a request")
                out.append(
                    codec.RequestError(
                        f"The request could not be decoded: {type(err).__name__}: {err}"
                    )
                )
        return out

    def _content_type(self, idx: int) -> str:
        """Request `idx`'s Content-Type media type, lower case ('' when there is none)."""
        try:
            headers = self.context.get_all_request_header(idx)
        except (AttributeError, IndexError, KeyError, TypeError):
            return ""
        for name, value in (headers or {}).items():
            # Parameter entries (name -> {"content-type": ...}) sit in the same dict.
            if str(name).lower() == "content-type" and isinstance(value, str):
                return value.split(";", 1)[0].strip().lower()
        return ""

    def _image_inputs(self, decoded: codec.Decoded) -> codec.Decoded:
        # The same resize as training (pipeline.zoo.data.preprocess_digits).
        name = self.specs[0].name
        x = torch.from_numpy(decoded.arrays[name])
        size = int(self.image_size or 0)
        if tuple(x.shape[-2:]) != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        return codec.Decoded({name: x.contiguous().numpy()}, "image", unbatched=False)

    def _batch_axis(self, spec: TensorRecord) -> int:
        return spec.batch_axis or 0

    @timed
    def inference(self, data: list[Any], *args: Any, **kwargs: Any) -> list[Result]:
        """Stack requests whose non-batch shapes agree; one forward pass per group.

        The batch axis is not always first: for (seq, batch, features) inputs a
        request's non-batch shape is compared over all the other axes.
        """
        results: list[Any] = list(data)
        groups: dict[tuple, list[int]] = {}
        for i, item in enumerate(data):
            if isinstance(item, codec.Decoded):
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
            self._run_group(data, members, results)
        return results

    def _run_group(self, data: list[Any], members: list[int], results: list[Any]) -> None:
        """One forward pass for `members`; a stacked pass that fails runs again request by
        request, so a request the model cannot take fails alone, not its peers."""
        batch = {
            spec.name: np.concatenate(
                [data[i].arrays[spec.name] for i in members], axis=self._batch_axis(spec)
            )
            for spec in self.specs
        }
        if len(members) > 1:
            logger.info("dynamic batching: %d requests in one forward pass", len(members))
        try:
            outputs = self._forward(batch)
        except Exception as err:
            if len(members) > 1:
                logger.warning(
                    "a pass of %d stacked requests failed (%s); each alone", len(members), err
                )
                for i in members:
                    self._run_group(data, [i], results)
                return
            logger.exception("inference failed for 1 request")
            results[members[0]] = codec.RequestError(
                f"Inference failed: {failure.summary(err)}", status=500
            )
            return
        start = 0
        first = self.specs[0]
        for i in members:
            n = data[i].arrays[first.name].shape[self._batch_axis(first)]
            parts = [
                np.take(o, range(start, start + n), axis=ax)
                for o, ax in zip(outputs, self.output_axes, strict=False)
            ]
            results[i] = (data[i], parts if len(members) > 1 else outputs)
            start += n

    @timed
    def postprocess(self, data: list[Result]) -> list[str]:
        """Each request's answer as JSON text, measured against the frontend's response
        limit (responses.fit): TorchServe encoded dicts itself (indented, several times
        the size), and its frontend dropped the worker for an answer past the limit."""
        # orjson writes a NaN or Inf as null, as the KServe runtime answers: json.dumps wrote
        # Infinity, which is no JSON (strict parsers refused the whole answer).
        answers = [
            orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY).decode() for a in self._answers(data)
        ]
        for refused in responses.fit([len(a) for a in answers], responses.limit()):
            logger.warning("request %d of the batch: %s", refused.index, refused.message)
            self.context.set_response_status(refused.status, "Answer too large", refused.index)
            answers[refused.index] = json.dumps({"error": refused.message})
        return answers

    def _answers(self, data: list[Result]) -> list[dict[str, Any]]:
        answers = []
        for idx, item in enumerate(data):
            self.context.set_response_content_type(idx, "application/json")
            if isinstance(item, codec.RequestError):
                # The phrase becomes the HTTP status line: one line of ASCII only.
                phrase = " ".join(str(item).split())[:200].encode("ascii", "replace").decode()
                self.context.set_response_status(item.status, phrase, idx)
                answers.append(item.to_json())
                continue
            decoded, outputs = item
            answers.append(
                codec.encode_outputs(
                    self.contract.output_names,
                    outputs,
                    decoded.protocol,
                    self.model_name,
                    decoded.unbatched,
                    self.topk,
                    self.contract.per_sample,
                    decoded.asked,
                    self.model_version,
                )
            )
        return answers

    def describe_handle(self) -> dict[str, Any]:
        """What a client must send and gets back (TorchServe's `describe` request)."""
        return {
            "model": self.contract.model.name,
            "format": self.format_key,
            "device": str(self.device),
            "inputs": [s.describe() for s in self.specs],
            "outputs": [o.describe() for o in self.contract.outputs],
            "accepts_images": self.image_size is not None,
            "image_size": self.image_size,
            "topk": self.topk,
            "stack_requests": self.stack_requests,
            "max_samples": self.limits.max_samples,
            "max_input_bytes": self.limits.max_bytes,
            "protocols": ["json", "v2", "npy", "npz", *(["image"] if self.image_size else [])],
        }
