"""The Ray ingress's answer: the outputs a request asked for, each in JSON or binary.

What a request may ask of its answer is the protocol's one rule (pipeline_runtime.asked,
as the KServe runtime's routes): the outputs it names, in its order (all when it names
none), each in binary or JSON as its flags say. What cannot be answered as asked (a name
the model lacks, the classification extension, a flag that is not a boolean) is the
client's error, refused before the model runs (`asked.plan`; app.py answers 400).
"""

from __future__ import annotations

import numpy as np
import orjson

from pipeline_runtime import oip
from pipeline_runtime.asked import plan


def encode(
    request: oip.Request, meta: dict[str, str], names: list[str], arrays: list[np.ndarray]
) -> tuple[bytes, int | None]:
    """The REST answer (JSON, or the binary extension's header + bytes and the header's
    length) to `request` from the model's outputs; `meta` is model_name and model_version."""
    tensors = {n: oip.Tensor.from_array(n, a) for n, a in zip(names, arrays, strict=True)}
    answered = [(tensors[name], binary) for name, binary in plan(request, names)]
    header = {**meta, **({"id": request.id} if request.id is not None else {})}
    header["outputs"] = [t.to_json(binary) for t, binary in answered]
    head = orjson.dumps(header)  # NaN and Inf as null (json.dumps wrote Infinity: no JSON)
    tails = [t.raw() for t, binary in answered if binary]
    return (head + b"".join(tails), len(head)) if tails else (head, None)
