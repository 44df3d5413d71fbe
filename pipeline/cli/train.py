"""`pipeline train`: arguments → `TrainConfig` → `train()`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.args import kwargs_arg, model_arg

if TYPE_CHECKING:
    from pipeline.train import TrainResult


def add_train_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a built-in model and write a checkpoint",
        description="Seeded, deterministic training; writes <model>/checkpoint.pt, its .json "
        "sidecar, a resumable .state.pt, a .summary.txt and a .png plot, atomically, after every "
        "epoch. Several processes: torchrun --nproc-per-node N -m pipeline train ... "
        "(DistributedDataParallel; --batch-size is the global batch). Only the built-in models "
        "have a task (data and loss) here; train your own in your code and export its "
        "state_dict with `pipeline export --weights`.",
    )
    model_arg(p, built_in_only=True)
    p.add_argument(
        "--out", type=Path, help="checkpoint path (default: <artifacts>/<model>/checkpoint.pt)"
    )
    p.add_argument("--epochs", type=int, help="epochs (default: the model's, else 12)")
    p.add_argument("--batch-size", type=int, help="batch size (default: the model's, else 64)")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the model's, else 3e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed for every RNG (default: 0)")
    p.add_argument(
        "--workers", type=int, default=0, help="DataLoader worker processes (default: 0)"
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--amp",
        action="store_true",
        help="mixed precision: fp16 autocast + GradScaler on CUDA, bf16 autocast on CPU "
        "(the checkpoint stays float32)",
    )
    p.add_argument(
        "--clip-grad-norm",
        type=float,
        metavar="MAX",
        help="clip the gradient norm (after unscaling)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from <checkpoint>.state.pt (model, optimizer, scheduler, scaler, RNG, epoch)",
    )
    p.add_argument(
        "--stop-after-epoch",
        type=int,
        metavar="N",
        help="stop cleanly after epoch N, as an interrupted run would (continue with --resume)",
    )
    p.add_argument(
        "--no-report", action="store_true", help="skip the model summary and the PNG plot"
    )
    # Train takes built-in models only, whose arguments are fixed by their zoo entry: the
    # help said "overriding its defaults", and every other value was refused.
    kwargs_arg(
        p,
        "the built-in model's constructor arguments (fixed by its zoo entry: a value other "
        "than its own is refused; export takes a module:Class's)",
    )
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from pipeline.core.defaults import DEFAULT_MODEL
    from pipeline.core.errors import PipelineError
    from pipeline.train import TrainConfig, distributed, entry_for, train

    models = list(dict.fromkeys(args.models or [DEFAULT_MODEL]))
    if len(models) > 1:
        for flag, value in (("--out", args.out), ("--model-kwargs", args.model_kwargs)):
            if value is not None:
                raise PipelineError(
                    f"{flag} applies to one model; train {', '.join(models)} one at a time "
                    f"to give each its own {flag}."
                )
    configs = [TrainConfig.from_args(args, model) for model in models]
    refused = None
    for config in configs:  # every name checked before the first one trains
        try:
            entry_for(config)
        except PipelineError as err:
            # Under torchrun, said to every rank once the group is up (train): raised here,
            # another machine's launcher waited for this one for half an hour.
            if not distributed.from_env().distributed:
                raise
            refused = refused or str(err)
    with distributed.held():  # under torchrun, one process group for every model
        for config in configs:
            _report(train(config, refused), several=len(configs) > 1)
    return 0


def _report(result: TrainResult, several: bool) -> None:
    meta = result.checkpoint.meta
    if not meta:  # a non-zero rank under torchrun: rank 0 reports
        return
    if several:
        print(f"model:      {meta['model']['name']}")
    print(f"checkpoint: {result.checkpoint.path}")
    print(f"sha256:     {meta['weights_sha256']}")
    metrics = {k: v for k, v in meta["metrics"].items() if k != "history"}
    print(f"metrics:    {json.dumps(metrics)}  ({result.seconds:.1f} s)")
