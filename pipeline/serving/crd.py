"""Checking a Kubernetes custom resource against its CRD's vendored schema, as the API
server and `kubectl --validate=strict` would (the KServe and Ray runtimes' deploy targets).

A schema is the `openAPIV3Schema` of one CRD version, vendored gzipped as compact JSON
in the runtime's package (its SOURCE.md says where it came from). Validated with
jsonschema's Draft 4 validator (OpenAPI 3.0 schema objects are draft-4-like), plus what
the API server and kubectl add:

* strict fields: a schema leaves `additionalProperties` open, so the API server silently
  prunes an unknown field and `kubectl --validate=strict` refuses it. To catch a typo
  (`minReplica`) the same way, every object node with `properties` and no
  `additionalProperties` / `x-kubernetes-preserve-unknown-fields` is closed;
* `format: int32/int64` ranges, which jsonschema does not check by default.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any


@functools.cache
def load(package: str, filename: str) -> dict[str, Any]:
    """The schema vendored as `schema/<filename>` in `package`."""
    data = resources.files(package).joinpath("schema", filename).read_bytes()
    return json.loads(gzip.decompress(data))


def close(node: Any) -> Any:
    """`node` with additionalProperties: false on every object that lists its properties."""
    if isinstance(node, dict):
        out = {k: close(v) for k, v in node.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [close(v) for v in node]
    return node


@functools.cache
def _validator(package: str, filename: str, strict: bool) -> Any:
    from jsonschema import Draft4Validator, FormatChecker

    checker = FormatChecker()

    @checker.checks("int32")
    def _int32(value: object) -> bool:
        return not isinstance(value, int) or -(2**31) <= value < 2**31

    @checker.checks("int64")
    def _int64(value: object) -> bool:
        return not isinstance(value, int) or -(2**63) <= value < 2**63

    schema = load(package, filename)
    return Draft4Validator(
        close(copy.deepcopy(schema)) if strict else schema, format_checker=checker
    )


def _where(path: Any) -> str:
    return "/".join(str(p) for p in path) or "(top level)"


def schema_errors(
    manifest: dict[str, Any], package: str, filename: str, *, strict: bool = True
) -> list[str]:
    """One line per way `manifest` breaks the schema: 'spec/predictor/x: why'."""
    found = _validator(package, filename, strict).iter_errors(manifest)
    return [f"{_where(e.path)}: {e.message}" for e in sorted(found, key=lambda e: list(e.path))]


def listed(found: list[str], limit: int = 20) -> str:
    """Problems as an indented list, at most `limit` of them."""
    more = f"\n  … and {len(found) - limit} more" if len(found) > limit else ""
    return "\n  ".join(found[:limit]) + more


def iter_documents(text: str) -> Iterator[dict[str, Any]]:
    """The non-empty documents of a multi-document YAML text."""
    import yaml

    for doc in yaml.safe_load_all(text):
        if doc is not None:
            yield doc


_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # DNS-1123 label: a namespace
_QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_SCALE = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip


def _quantity(value: Any) -> float | None:
    matched = _QUANTITY.match(str(value))
    return float(matched[1]) * _SCALE[matched[2] or ""] if matched else None


def pod_errors(node: Any, where: str = "") -> list[str]:
    """What the API server refuses that the CRD schemas leave open: a namespace that is no
    DNS label, an image reference with white space, a request above its limit (Kubernetes:
    "must be less than or equal to cpu limit"). Walks the whole manifest."""
    out: list[str] = []
    if isinstance(node, dict):
        namespace = node.get("namespace") if where.endswith("metadata") else None
        if namespace is not None and not (_LABEL.match(str(namespace)) and len(namespace) <= 63):
            out.append(f"{where}/namespace: {namespace!r} must be a DNS label (lower-case "
                       "letters, digits and '-', at most 63)")  # fmt: skip
        image = node.get("image")
        if isinstance(image, str) and (not image or any(c.isspace() for c in image)):
            out.append(f"{where}/image: {image!r} is no image reference")
        resources = node.get("resources")
        if isinstance(resources, dict):
            asked, most = resources.get("requests") or {}, resources.get("limits") or {}
            for kind in sorted(set(asked) & set(most)):
                low, high = _quantity(asked[kind]), _quantity(most[kind])
                if low is not None and high is not None and low > high:
                    out.append(f"{where}/resources: the {kind} request {asked[kind]} is over "
                               f"its limit {most[kind]}")  # fmt: skip
        for key, value in node.items():
            out += pod_errors(value, f"{where}/{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += pod_errors(value, f"{where}/{i}")
    return out
