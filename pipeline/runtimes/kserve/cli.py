"""`pipeline deploy kserve`: write what a user applies to a Kubernetes cluster with KServe.

The KServe runtime's deploy target, which it declares through the runtime contract
(the runtime's `deploy` capability). Like the rest of the CLI, this only parses arguments and
calls a stage function (pipeline.runtimes.kserve.deploy).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.core import paths
from pipeline.core.cliargs import model_from_export
from pipeline.core.defaults import DEFAULT_MODEL

_EPILOG = """\
writes into --out:
  Dockerfile, kserve.json, export/, src/   the project's KServe runtime image (build from --out)
  inferenceservice.yaml                   custom container, Open Inference Protocol v2, REST 8080, gRPC 8081
  inferenceservice-gpu.yaml               the same requesting nvidia.com/gpu: 1
  torchserve/config/config.properties     KServe's TorchServe layout: copy config/ and model-store/
  torchserve/model-store/<model>_<fmt>.mar  to the storage behind --storage-uri
  torchserve/inferenceservice.yaml        model format pytorch, protocolVersion v2
  README.md                               the commands to build and apply

Every manifest is validated against KServe's InferenceService CRD schema (v0.20.0,
unknown fields refused as by kubectl --validate=strict) before anything is written.

example:  pipeline deploy kserve --model digits_lenet --out artifacts/deploy/digits_lenet
"""


def add_deploy_target(targets: argparse._SubParsersAction) -> None:
    """Add `pipeline deploy kserve` (the `deploy` command's targets come from the runtimes)."""
    p = targets.add_parser(
        "kserve",
        help="KServe InferenceServices: the project's runtime image, and TorchServe",
        description="Write a Dockerfile for the project's KServe runtime with the export copied "
        "in, InferenceService manifests for it (CPU and GPU), and KServe's TorchServe layout "
        "(config.properties, model-store/*.mar) with its InferenceService.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        help=f"the exported model (default: the model --export-dir holds, else {DEFAULT_MODEL}; "
        "see `pipeline models`)",
    )
    model_from_export(p)
    p.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--format",
        help="which artifact of the export to serve (default: the one `pipeline serve` "
        "serves: bench's fastest verified format, else the first held in registry order, "
        "leaving out TorchScript when this torch refuses torch.jit)",
    )
    p.add_argument(
        "--name",
        help="InferenceService name (default: from the model, e.g. digits-lenet); "
        "lower-case letters, digits and '-'",
    )
    p.add_argument("--namespace", help="metadata.namespace (default: none: kubectl's current)")
    p.add_argument(
        "--image",
        help="the runtime image you will build and push (default: pipeline-<name>:latest)",
    )
    p.add_argument("--gpu-image", help="the GPU build of it (default: <image>-gpu)")
    p.add_argument("--cpu-request", default="1", help="default: 1")
    p.add_argument("--cpu-limit", default="2", help="default: 2")
    p.add_argument("--memory-request", default="2Gi", help="default: 2Gi")
    p.add_argument("--memory-limit", default="4Gi", help="default: 4Gi")
    p.add_argument("--min-replicas", type=int, default=1, help="default: 1")
    p.add_argument("--max-replicas", type=int, default=3, help="default: 3")
    p.add_argument(
        "--scale-metric",
        choices=("cpu", "memory"),
        default="cpu",
        help="what the HorizontalPodAutoscaler scales on (default: cpu)",
    )
    p.add_argument(
        "--scale-target",
        type=int,
        default=70,
        help="target utilisation in percent (default: 70)",
    )
    p.add_argument(
        "--storage-uri",
        help="where the cluster finds the TorchServe layout (default: pvc://models/<name>)",
    )
    p.add_argument(
        "--torchserve-envelope",
        action="store_true",
        help="turn on TorchServe's kservev2 envelope (off by default: the project's handler "
        "answers the Open Inference Protocol itself, and refuses what the envelope passes it)",
    )
    p.add_argument("--force", action="store_true", help="replace --out if it is not empty")
    p.set_defaults(func=_cmd_deploy_kserve)


def _cmd_deploy_kserve(args: argparse.Namespace) -> int:
    from pipeline.runtimes.kserve.deploy import deploy_kserve
    from pipeline.runtimes.kserve.manifests import DeployConfig

    export_dir = args.export_dir or paths.export_dir(args.model, args.artifacts_dir)
    from pipeline.serving.versions import not_the_default

    if args.export_dir is None and (warning := not_the_default(args.model, export_dir)):
        print(f"warning: {warning}", file=sys.stderr)
    config = DeployConfig(
        model=args.model,
        export_dir=export_dir,
        out=args.out,
        format=args.format or "",  # "": what `pipeline serve` serves (deploy_kserve says which)
        name=args.name or "",
        namespace=args.namespace,
        image=args.image or "",
        gpu_image=args.gpu_image or "",
        cpu_request=args.cpu_request,
        cpu_limit=args.cpu_limit,
        memory_request=args.memory_request,
        memory_limit=args.memory_limit,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        scale_metric=args.scale_metric,
        scale_target=args.scale_target,
        storage_uri=args.storage_uri or "",
        torchserve_envelope=args.torchserve_envelope,
    )
    result = deploy_kserve(config, force=args.force)
    print(f"wrote {result.out}")
    for f in result.files:
        if f.parent.name != "export":
            print(f"  {f.relative_to(result.out)}")
    from pipeline.runtimes.kserve import leanimage
    from pipeline.runtimes.kserve.deploy import PROJECT_ROOT

    which = "torch-free (ONNX Runtime)" if result.torch_free else "with torch"
    print(f"image: {which}; {leanimage.sizes(PROJECT_ROOT / 'pyproject.toml').describe()}")
    print(
        f"next: docker build -t {config.image} {result.out} && kubectl apply -f "
        f"{result.out / 'inferenceservice.yaml'}  (see {result.out / 'README.md'})"
    )
    return 0
