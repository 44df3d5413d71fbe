"""Which models the Ray runtime's ingress calls down (pipeline/runtimes/ray/availability.py),
read from Ray Serve's own status objects. The ingress answering 503 and not ready on a
real cluster is in tests/integration/test_ray_runtime.py."""

from __future__ import annotations

from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger, ReplicaState
from ray.serve.schema import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatusOverview,
    ServeStatus,
)

from pipeline.runtimes.ray.availability import reason, unavailable
from pipeline.runtimes.ray.constants import deployment_name

APP = "pipeline-1234"
REFUSED = (
    "A replica failed to start with exception. Retrying. Error:\nTraceback (most recent "
    'call last):\n  File "app.py", line 98, in __init__\n    loaded = load(...)\n'
    "pipeline.core.signing.SignatureError: Refused: the version in /s/m/1 changed since it "
    "was signed (model.onnx differs from the signed bytes).\n"
)


def _status(**deployments: tuple[str, dict[str, int], str]) -> ServeStatus:
    overviews = {
        deployment_name(model): DeploymentStatusOverview(
            status=DeploymentStatus(status),
            status_trigger=DeploymentStatusTrigger.UNSPECIFIED,
            replica_states={ReplicaState(k): n for k, n in replicas.items()},
            message=message,
        )
        for model, (status, replicas, message) in deployments.items()
    }
    app = ApplicationStatusOverview(ApplicationStatus.RUNNING, "", 0.0, overviews)
    return ServeStatus(applications={APP: app})


def test_a_model_without_a_running_replica_and_failing_is_down_with_its_exception() -> None:
    status = _status(
        broken=("UNHEALTHY", {"STARTING": 1}, REFUSED),
        failed=("DEPLOY_FAILED", {}, "The deployment failed to start 3 times in a row."),
        fine=("HEALTHY", {"RUNNING": 2}, ""),
        # One replica of two lost: the other answers, so the model is not down.
        degraded=("UNHEALTHY", {"RUNNING": 1, "STARTING": 1}, REFUSED),
        # Autoscaled to zero: its requests wait for the scale-up, as Serve intends.
        idle=("HEALTHY", {}, ""),
        starting=("UPDATING", {"STARTING": 1}, ""),
    )
    names = {m: deployment_name(m) for m in ("broken", "failed", "fine", "degraded", "idle")}
    down = unavailable(status, APP, names | {"starting": deployment_name("starting")})
    assert down == {
        "broken": "pipeline.core.signing.SignatureError: Refused: the version in /s/m/1 "
        "changed since it was signed (model.onnx differs from the signed bytes).",
        "failed": "The deployment failed to start 3 times in a row.",
    }
    assert unavailable(status, "another-app", names) == {}  # another run's application
    assert unavailable(ServeStatus(), APP, names) == {}  # Serve not up (yet)


def test_the_reason_is_one_line() -> None:
    assert reason("") == "Ray Serve gives no reason"
    assert reason("  A replica's health check failed.  ") == "A replica's health check failed."
    assert "\n" not in reason(REFUSED) and reason(REFUSED).startswith("pipeline.core.signing")
