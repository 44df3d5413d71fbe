"""JSON values (a nested list, or one number) → a checked numpy array of an input's dtype.

The one reader of tensor values sent as JSON: the handlers' JSON and the Open Inference
Protocol's JSON `data` both come here (`pipeline_runtime.codec`). Values the dtype cannot
hold are refused (a 400), never wrapped, truncated or coerced as numpy's cast would.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from pipeline_runtime.request import MAX_JSON_DEPTH, InputSpec, RequestError

# The numpy dtypes JSON values are read as (each with its checks in `to_array`); the Open
# Inference Protocol's datatype table is `pipeline_runtime.oip`'s, the only one.
JSON_DTYPES = ("float32", "float64", "float16", "int64", "int32", "bool")


def scan(value: Any, limit: int) -> tuple[int, set[type]]:
    """How deeply lists and dicts nest in `value` (counted no further than `limit` + 1, the
    numbers' level included: [1, 2] is 2) and the types found at the bottom. Level by
    level, in C where a level is lists only (`set(map(type))`, `chain.from_iterable`): a
    Python loop over every element (isinstance) cost several times numpy's own parse."""
    depth, level, leaves = 0, [value], set()
    while level:
        depth += 1
        if depth > limit:
            return depth, leaves
        types = set(map(type, level))
        if types == {list}:  # a tensor's rows: all lists, flattened in C
            level = list(chain.from_iterable(level))
            continue
        leaves |= types - {list, dict}
        if list not in types and dict not in types:  # numbers only: the bottom
            break
        level = list(
            chain.from_iterable(
                item.values() if type(item) is dict else item
                for item in level
                if type(item) in (list, dict)
            )
        )
    return depth, leaves


def to_array(value: Any, spec: InputSpec) -> np.ndarray:
    """`value` as an array of `spec.dtype`, or RequestError (400) naming what is wrong."""
    if isinstance(value, bool | int | float):
        value = [value]
    if not isinstance(value, list):
        raise RequestError(
            f"Input {spec.name!r} must be a (nested) list of numbers, got {type(value).__name__}.",
            expected=spec.describe(),
        )
    nesting, leaves = scan(value, MAX_JSON_DEPTH)
    if nesting > MAX_JSON_DEPTH:
        raise RequestError(f"Input {spec.name!r} is nested too deeply.", expected=spec.describe())
    try:
        if spec.dtype not in JSON_DTYPES:
            raise KeyError(spec.dtype)
        target = np.dtype(spec.dtype).type
        raw = np.array(value)
        if raw.dtype.kind not in "biuf":  # strings, objects, ragged lists
            raise ValueError("not numbers")
        # true/false are not numbers (Triton refuses them too), nor is 5 a bool: numpy
        # would read them as 1 and 0, and as True.
        if target is not np.bool_ and bool in leaves:
            raise RequestError(
                f"Input {spec.name!r} is {spec.dtype}: send numbers, not true/false.",
                expected=spec.describe(),
            )
        if target is np.bool_ and raw.dtype.kind != "b" and not np.isin(raw, (0, 1)).all():
            raise RequestError(
                f"Input {spec.name!r} is bool: send true/false (or 0 and 1).",
                expected=spec.describe(),
            )
        if (
            np.issubdtype(target, np.integer)
            and raw.dtype.kind == "f"
            and not np.all(raw == np.round(raw))
        ):
            raise RequestError(
                f"Input {spec.name!r} is {spec.dtype}: fractional values are not integers.",
                expected=spec.describe(),
            )
        if np.issubdtype(target, np.integer) and raw.dtype.kind in "iuf":
            # Found by fuzzing: casting 1e300, Infinity or 2**63 to int64 does not
            # fail, it silently wraps (to -2**63). Refuse values the dtype cannot hold.
            info = np.iinfo(target)
            if raw.dtype.kind == "f":  # float(info.max) rounds up to 2**63: exclusive bound
                fits = (raw >= info.min) & (raw < -float(info.min))
            else:
                fits = (raw >= info.min) & (raw <= info.max)
            if not fits.all():
                raise RequestError(
                    f"Input {spec.name!r} has values outside the {spec.dtype} range.",
                    expected=spec.describe(),
                )
        with np.errstate(over="ignore", invalid="ignore"):  # overflow → Inf, refused below
            array = raw.astype(target)
    except KeyError:
        raise RequestError(
            f"The model's input dtype {spec.dtype} is not supported over JSON."
        ) from None
    except (ValueError, TypeError, OverflowError):
        raise RequestError(
            f"Input {spec.name!r} must be a rectangular nested list of {spec.dtype} numbers.",
            expected=spec.describe(),
        ) from None
    return array
