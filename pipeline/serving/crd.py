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
