"""`pipeline deploy ray`: write what a user applies to a Kubernetes cluster with KubeRay.

The Ray runtime's deploy target, declared through the runtime contract (its `deploy`
capability); it parses arguments and calls pipeline.runtimes.ray.deploy.
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
  Dockerfile, export/, src/   Ray's image with the project and the export
  serve_config.yaml           the Serve application (OIP ingress + the model's deployment)
  rayservice.yaml             KubeRay RayService: that Serve config and its Ray cluster
  networkpolicy.yaml          the head's dashboard (8265, Ray's Jobs API: no auth) to the
                              KubeRay operator's pods only
  README.md                   the commands to build, create the token Secret and apply

The RayService is validated against KubeRay's CRD schema (v1.7.0, unknown fields refused
as by kubectl --validate=strict) before anything is written.

example:  pipeline deploy ray --model digits_lenet --out artifacts/deploy/ray
"""


def add_deploy_target(targets: argparse._SubParsersAction) -> None:
    p = targets.add_parser(
        "ray",
        help="a KubeRay RayService: Ray Serve on a Kubernetes Ray cluster",
        description="Write a Dockerfile (Ray's image, the project, the export), the Serve "
        "config and a KubeRay RayService that runs it on a Ray cluster of its own.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", help=f"default: the model --export-dir holds, else {DEFAULT_MODEL}")
    model_from_export(p)
    p.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument("--format", help="the artifact to serve (default: what `pipeline serve` picks)")
    p.add_argument("--name", help="RayService name (default: from the model, e.g. digits-lenet)")
    p.add_argument("--namespace", help="metadata.namespace (default: kubectl's current)")
    p.add_argument(
        "--image", help="the image you will build and push (default: pipeline-ray-<name>:latest)"
    )
    p.add_argument("--workers", type=int, default=2, help="worker pods (default: 2)")
    p.add_argument(
        "--max-workers",
        type=int,
        default=0,
        help="let KubeRay's autoscaler add worker pods up to N (default: off)",
    )
    p.add_argument(
        "--replicas", type=int, default=2, help="Serve replicas, one per pod (default: 2)"
    )
    p.add_argument("--cpu", default="1", help="each pod's CPU (default: 1)")
    p.add_argument("--memory", default="2Gi", help="each pod's memory (default: 2Gi)")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="one GPU per worker pod (nvidia.com/gpu: 1), which its replica runs on; the "
        "image starts from Ray's CUDA image",
    )
    p.add_argument(
        "--kuberay-namespace",
        default="default",
        metavar="NS",
        help="the namespace KubeRay's operator runs in: the only one networkpolicy.yaml "
        "lets reach the head's dashboard (default: default)",
    )
    p.add_argument("--force", action="store_true", help="replace --out if it is not empty")
    p.set_defaults(func=_cmd_deploy_ray)


def _cmd_deploy_ray(args: argparse.Namespace) -> int:
    from pipeline.runtimes.ray.deploy import RayDeployConfig, deploy_ray
    from pipeline.serving.versions import not_the_default

    export_dir = args.export_dir or paths.export_dir(args.model, args.artifacts_dir)
    if args.export_dir is None and (warning := not_the_default(args.model, export_dir)):
        print(f"warning: {warning}", file=sys.stderr)
    config = RayDeployConfig(
        model=args.model,
        export_dir=export_dir,
        out=args.out,
        format=args.format,
        name=args.name or "",
        namespace=args.namespace,
        image=args.image or "",
        workers=args.workers,
        max_workers=args.max_workers,
        replicas=args.replicas,
        cpu=args.cpu,
        memory=args.memory,
        gpu=args.gpu,
        operator_namespace=args.kuberay_namespace,
    )
    files = deploy_ray(config, force=args.force)
    print(f"wrote {args.out}")
    for f in files:
        print(f"  {f.relative_to(args.out)}")
    print(
        f"next: docker build -t {config.image} {args.out} && kubectl apply -f "
        f"{args.out / 'rayservice.yaml'} -f {args.out / 'networkpolicy.yaml'}  (see {args.out / 'README.md'})"
    )
    return 0
