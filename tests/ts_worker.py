"""A .mar loaded in this process the way TorchServe 0.12 loads it, without Java.

The frontend unzips the archive into `<java.io.tmpdir>/models/<uuid>`
(`ZipUtils.unzip`; here a folder the test names) and starts
`ts/model_service_worker.py` in that folder, with the folder on its PYTHONPATH.
The worker's `load_model` then calls `ModelLoaderFactory.get_model_loader().load(...)`
with the archive's model name, that folder, the handler named in
MAR-INF/MANIFEST.json, `gpu` (None on a server without GPUs), the batch size from
the archive's model-config.yaml (1 when it sets none), no envelope,
`limitMaxImagePixels` True and its metrics cache (built from
`ts/configs/metrics.yaml`, the frontend's default `--metrics-config`). `load` does
exactly that, so the handler and the `pipeline_runtime` it imports are the
archive's copies, not this repository's, and whatever the handler's `initialize`
raises comes out here, as it would end the worker's load.

Everything process-wide it touches is put back when it returns or raises:
sys.path, sys.modules (the archive's modules are dropped, the test process's own
restored), the working directory, the environment and torch's thread count.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml


def unpack(mar: Path, tmp: Path) -> Path:
    """The model folder TorchServe's frontend extracts `mar` into, `tmp` standing for its
    java.io.tmpdir."""
    model_dir = tmp / "models" / uuid.uuid4().hex
    with zipfile.ZipFile(mar) as zf:
        zf.extractall(model_dir)
    return model_dir


def _shipped(model_dir: Path) -> set[str]:
    """The top-level modules and packages the archive carries (its handler, pipeline_runtime)."""
    return {p.stem for p in model_dir.glob("*.py")} | {
        p.parent.name for p in model_dir.glob("*/__init__.py")
    }


def load(mar: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, gpu: int | None = None) -> Any:
    """Unpack `mar` under `tmp` and load it as TorchServe's worker does: a `ts.service.Service`,
    or the exception the handler's `initialize` raised. `gpu`: the GPU id the frontend hands
    a worker on a server started with GPUs (None: number_of_gpu=0)."""
    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
    from ts.model_loader import ModelLoaderFactory

    model_dir = unpack(mar, tmp)
    model = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    config = yaml.safe_load((model_dir / model["configFile"]).read_text()) or {}
    shipped = _shipped(model_dir)
    env, threads = dict(os.environ), torch.get_num_threads()
    with monkeypatch.context() as m:
        m.chdir(model_dir)  # the worker's working directory
        m.syspath_prepend(str(model_dir))  # the frontend puts the model dir on PYTHONPATH
        for name in [n for n in sys.modules if n.split(".")[0] in shipped]:
            m.delitem(sys.modules, name)  # restored when the context ends
        try:
            metrics = MetricsCacheYamlImpl(
                config_file_path=str(Path(ts.__file__).parent / "configs" / "metrics.yaml")
            )
            metrics.initialize_cache()
            metrics.model_name = model["modelName"]
            return ModelLoaderFactory.get_model_loader().load(
                model["modelName"],
                str(model_dir),
                model["handler"],
                gpu,
                int(config.get("batchSize") or 1),
                None,  # envelope: `pipeline serve` sets no service_envelope
                True,  # limitMaxImagePixels
                metrics,
            )
        finally:
            loaded = {
                n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in shipped
            }
            os.environ.clear()
            os.environ.update(env)
            torch.set_num_threads(threads)
            # What ran was the archive's copy, not this repository's.
            handler = Path(model["handler"]).stem
            for name in (handler, "pipeline_runtime"):
                where = getattr(loaded.get(name), "__file__", None)
                assert where and Path(where).is_relative_to(model_dir), (name, where)


def infer(
    service: Any, bodies: list[Any], headers: dict[str, str] | None = None
) -> list[tuple[int, Any]]:
    """One batch through a loaded service as the worker passes it (JSON bodies; None: a form
    field instead of a body); (status, answer) per request."""
    from ts.service import Service

    batch = [
        {
            "requestId": f"r{i}".encode(),
            "parameters": [{"name": "body", "value": body, "contentType": "application/json"}]
            if body is not None
            else [{"name": "field", "value": b"abc", "contentType": "text/plain"}],
            "headers": [
                {"name": k.encode(), "value": v.encode()} for k, v in (headers or {}).items()
            ],
        }
        for i, body in enumerate(bodies)
    ]
    processors, inputs, ids = Service.retrieve_data_for_inference(batch)
    service.context.request_ids = ids
    service.context.request_processor = processors
    service.context.metrics.request_ids = ids
    answers = service._entry_point(inputs, service.context)
    # The handler hands back JSON text (what TorchServe sends as it is); describe, a dict.
    # Read strictly: Python's json takes NaN and Infinity, which no JSON parser must.
    return [
        (service.context.get_response_status(i)[0], _strict(a) if isinstance(a, str) else a)
        for i, a in enumerate(answers)
    ]


def _strict(text: str) -> Any:
    def refuse(word: str) -> None:
        raise ValueError(f"the answer holds {word}, which is not JSON: {text[:200]}")

    return json.loads(text, parse_constant=refuse)
