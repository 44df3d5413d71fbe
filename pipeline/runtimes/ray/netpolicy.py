"""`pipeline deploy ray`'s networkpolicy.yaml: who may reach the Ray head pod.

KubeRay needs the head's dashboard (8265) reachable from its operator, which sends the
Serve config through it, so the RayService sets `dashboard-host: 0.0.0.0`. But the
dashboard's Jobs API runs any code it is sent, with no authentication: anyone who can
reach 8265 runs code in the cluster. The policy keeps 8265 to the operator's pods,
the head's every port to the RayService's own pods (workers reach the GCS and the
head's raylet), and Serve's port (8000, the inference token's to guard) to everyone.
It holds only where the cluster's network plugin enforces NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

DASHBOARD_PORT = 8265
# On both pod templates, so the policy can name the RayService's own pods: KubeRay's
# labels name the generated RayCluster, whose name has a random suffix.
INSTANCE_LABEL = "app.kubernetes.io/instance"
NODE_TYPE_LABEL = "ray.io/node-type"  # KubeRay's, on every Ray pod: head or worker
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace
# The label KubeRay's Helm chart gives the operator's pods: with the namespace alone, every
# pod of the operator's namespace (often `default`, the RayService's own) reached 8265.
OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}


def pod_labels(name: str) -> dict[str, str]:
    """The labels the RayService's pod templates carry, for the policy's selectors."""
    return {INSTANCE_LABEL: name}


def network_policy(
    name: str, namespace: str | None, operator_namespace: str, serve_port: int
) -> dict[str, Any]:
    """The NetworkPolicy for RayService `name`'s head pod."""
    tcp = "TCP"
    metadata: dict[str, Any] = {"name": f"{name}-head"}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": {**pod_labels(name), NODE_TYPE_LABEL: "head"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                # The cluster's own pods: the GCS, the raylet, the object manager.
                {"from": [{"podSelector": {"matchLabels": pod_labels(name)}}]},
                # The dashboard, whose Jobs API runs code: the KubeRay operator only.
                {
                    "from": [
                        {  # both in one entry: the operator's pods in its namespace
                            "namespaceSelector": {
                                "matchLabels": {NAMESPACE_LABEL: operator_namespace}
                            },
                            "podSelector": {"matchLabels": OPERATOR_LABELS},
                        }
                    ],
                    "ports": [{"protocol": tcp, "port": DASHBOARD_PORT}],
                },
                # Serve's proxy: the inference token guards it.
                {"ports": [{"protocol": tcp, "port": serve_port}]},
            ],
        },
    }
