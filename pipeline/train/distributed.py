"""Multi-process training with torch.distributed (DistributedDataParallel).

`torchrun --nproc-per-node N -m pipeline train ...` sets RANK/WORLD_SIZE/
LOCAL_RANK; `setup()` joins the process group (gloo on CPU, nccl on CUDA).
A plain `pipeline train` is a world of one and needs no process group.
`torch.nn.DataParallel` is not used: PyTorch recommends DDP instead even on a
single machine (one process per device, no GIL contention, no scatter/gather
through one GPU).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pipeline.core.errors import PipelineError


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def from_env() -> World:
    """The world torchrun describes in the environment (a world of one otherwise)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(
        rank=int(os.environ.get("RANK", "0")),
        size=size,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def setup(world: World, device: torch.device) -> None:
    if world.distributed and not dist.is_initialized():
        if device.type == "cuda":
            # Bind this rank to its GPU before NCCL starts, or every rank opens
            # a context on cuda:0 and collectives may pick the wrong device.
            torch.cuda.set_device(device)
            dist.init_process_group(
                backend="nccl", rank=world.rank, world_size=world.size, device_id=device
            )
        else:
            dist.init_process_group(backend="gloo", rank=world.rank, world_size=world.size)


_held = False  # set by held(): train() leaves the process group joined when it ends


def teardown(world: World) -> None:
    if world.distributed and dist.is_initialized() and not _held:
        dist.destroy_process_group()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Several trainings in one launch (`pipeline train --model A --model B`) share the
    process group the first one joins, left when the block ends: a torchrun rendezvous is
    joined once per process (destroying the group and joining it again for each model hung
    on the fourth of five, with gloo on 2 ranks)."""
    global _held
    _held = True
    try:
        yield
    finally:
        _held = False
        if dist.is_initialized():
            dist.destroy_process_group()


def all_sum(values: list[float], device: torch.device, world: World) -> list[float]:
    """Element-wise sum over ranks (identity in a world of one)."""
    if not world.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def agree(world: World, settings: dict[str, Any], problem: str | None = None) -> None:
    """Raise the same PipelineError on every rank when one of them found a `problem` (its
    arguments, rank 0's lock or output folder) or the ranks were started with other
    settings than rank 0: launchers with another --lr trained silently on rank 0's, and
    another --epochs ended in a gloo error on one side and a "successful" checkpoint on the
    other. A problem is said first: a rank that refused its arguments has no settings."""
    gathered: list[Any] = [(settings, problem)]
    if world.distributed:
        gathered = [None] * world.size
        dist.all_gather_object(gathered, (settings, problem))
    found = [(rank, p) for rank, (_, p) in enumerate(gathered) if p]
    if found:
        rank, message = found[0]
        raise PipelineError(
            message if rank == world.rank else f"rank {rank} stopped the run: {message}"
        )
    first = gathered[0][0]
    differing = []
    for key, value in first.items():
        others = [(rank, s.get(key)) for rank, (s, _) in enumerate(gathered) if s.get(key) != value]
        if others:
            shown = ", ".join(f"{v!r} on rank {rank}" for rank, v in others)
            differing.append(f"{key}: {value!r} on rank 0, {shown}")
    if differing:
        raise PipelineError(
            f"The {world.size} training processes were started with different settings ("
            + "; ".join(differing)
            + "). Start every launcher (each torchrun, on every machine) with the same "
            "`pipeline train` arguments."
        )
