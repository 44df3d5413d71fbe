"""Checking generated KServe manifests before a user applies them.

The schema is KServe's own: the `openAPIV3Schema` of the `v1beta1` version of the
InferenceService CRD, vendored in pipeline/runtimes/kserve/schema/ (SOURCE.md says where it
came from), checked as the API server and `kubectl --validate=strict` would
(pipeline.serving.crd: unknown fields refused, int32/int64 ranges), plus
the rules KServe's admission webhook applies that the schema does not express
(the metadata.name pattern, replica bounds, the autoscaler metric for the mode).
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.serving import crd
from pipeline.serving.crd import iter_documents

__all__ = ["ManifestError", "check", "crd_schema", "errors", "iter_documents", "schema_errors"]

_PACKAGE = "pipeline.runtimes.kserve"

SCHEMA_FILE = "inferenceservice-v1beta1.json.gz"
API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
# KServe's webhook (IsvcNameFmt, pkg/apis/serving/v1beta1/inference_service_validation.go).
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 63  # a DNS-1035 label: the name becomes part of Service and host names
DEPLOYMENT_MODES = {"Standard", "RawDeployment", "Knative", "Serverless"}
AUTOSCALER_CLASSES = {"hpa", "external", "keda", "none"}


class ManifestError(PipelineError):
    """A generated manifest would be refused (or silently changed) by the cluster."""


def crd_schema() -> dict[str, Any]:
    """The vendored v1beta1 openAPIV3Schema, as KServe publishes it."""
    return crd.load(_PACKAGE, SCHEMA_FILE)


def schema_errors(manifest: dict[str, Any], *, strict: bool = True) -> list[str]:
    """One line per way `manifest` breaks the CRD schema: 'spec/predictor/x: why'."""
    return crd.schema_errors(manifest, _PACKAGE, SCHEMA_FILE, strict=strict)


def webhook_errors(manifest: dict[str, Any]) -> list[str]:
    """The checks KServe's admission webhook makes that the schema cannot express."""
    out: list[str] = []
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        out.append(f"apiVersion/kind must be {API_VERSION} / {KIND}")
    meta = manifest.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > NAME_MAX:
        out.append(
            f"metadata/name: {name!r} must be at most {NAME_MAX} lower-case letters, digits "
            "and '-', start with a letter and end with a letter or digit"
        )
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, dict) else {}
    mode = annotations.get("serving.kserve.io/deploymentMode", "Standard")
    if mode not in DEPLOYMENT_MODES:
        out.append(f"deploymentMode {mode!r} must be one of {sorted(DEPLOYMENT_MODES)}")
    scaler = annotations.get("serving.kserve.io/autoscalerClass", "hpa")
    if scaler not in AUTOSCALER_CLASSES:
        out.append(f"autoscalerClass {scaler!r} must be one of {sorted(AUTOSCALER_CLASSES)}")
    spec = manifest.get("spec")
    pred = spec.get("predictor") if isinstance(spec, dict) else None
    pred = pred if isinstance(pred, dict) else {}
    lo, hi = pred.get("minReplicas", 1), pred.get("maxReplicas", 0)
    if isinstance(lo, int) and isinstance(hi, int):
        if lo < 0 or hi < 0:
            out.append("spec/predictor: minReplicas and maxReplicas must be 0 or more")
        elif hi and lo > hi:
            out.append(f"spec/predictor: minReplicas {lo} exceeds maxReplicas {hi}")
    metric, target = pred.get("scaleMetric"), pred.get("scaleTarget")
    if mode in ("Standard", "RawDeployment") and scaler == "hpa" and metric is not None:
        if metric not in ("cpu", "memory"):
            out.append(f"spec/predictor/scaleMetric: HPA scales on cpu or memory, not {metric!r}")
        elif metric == "cpu" and isinstance(target, int) and not 1 <= target <= 100:
            out.append("spec/predictor/scaleTarget: a cpu target is a percentage, 1 to 100")
    if mode in ("Knative", "Serverless") and metric not in (None, "concurrency", "rps"):
        out.append(
            f"spec/predictor/scaleMetric: Knative scales on concurrency or rps, not {metric!r}"
        )
    impls = [k for k in ("model", "pytorch", "onnx", "triton", "sklearn") if k in pred]
    if pred.get("containers"):
        impls.append("containers")
    if len(impls) != 1:
        out.append(f"spec/predictor: exactly one implementation expected, got {impls or 'none'}")
    # The schema check reports wrong types; these rules look only at what is well formed.
    containers = pred.get("containers")
    for c in containers if isinstance(containers, list) else []:
        env = c.get("env") if isinstance(c, dict) else None
        for e in env if isinstance(env, list) else []:
            if (
                isinstance(e, dict)
                and e.get("name") == "PROTOCOL"
                and e.get("value") not in ("v1", "v2")
            ):
                out.append("spec/predictor/containers: env PROTOCOL must be v1 or v2")
    return out


def errors(manifest: dict[str, Any], *, strict: bool = True) -> list[str]:
    return (
        schema_errors(manifest, strict=strict) + webhook_errors(manifest) + crd.pod_errors(manifest)
    )


def check(manifest: dict[str, Any], *, what: str = "manifest", strict: bool = True) -> None:
    """Raise ManifestError listing every problem (nothing when the manifest is valid)."""
    found = errors(manifest, strict=strict)
    if found:
        raise ManifestError(f"{what} is not a valid KServe {KIND}:\n  {crd.listed(found)}")
