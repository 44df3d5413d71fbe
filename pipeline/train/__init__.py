"""The training stage: a seeded, deterministic run that writes a checkpoint."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, default_collate
from tqdm import tqdm

from pipeline.core import paths
from pipeline.core.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError, UnknownModelError
from pipeline.core.fileio import atomic_write
from pipeline.core.paths import is_external
from pipeline.core.seeding import seed_everything, seed_worker
from pipeline.train import distributed, guard
from pipeline.train import report as train_report
from pipeline.train import state as train_state
from pipeline.train.config import DEFAULTS as DEFAULTS
from pipeline.train.config import TrainConfig, TrainResult
from pipeline.train.tasks import evaluate_sums, get_task, metrics_from_sums
from pipeline.zoo import resolve_entry
from pipeline.zoo.spec import ZooEntry

log = logging.getLogger(__name__)
# The training plot is drawn again at most this often (and always after the last epoch).
PLOT_EVERY_S = 30.0


def _initial_checkpoint(
    config: TrainConfig,
    name: str,
    kwargs: dict[str, Any],
    model: torch.nn.Module,
    out: Path,
    device: torch.device,
) -> TrainResult:
    """Models with nothing to learn (e.g. the parameter-free gate) get their
    seeded initial weights as a checkpoint, so export and verify treat every
    model the same way."""
    tqdm.write(f"{name} has no training task; writing its seeded initial weights")
    meta: dict[str, Any] = {
        "model": {"name": name, "kwargs": kwargs},
        "task": None,
        "init": "random",
        "seed": config.seed,
        "epochs": 0,
        "metrics": {"history": []},
        "device": str(device),
    }
    return TrainResult(save_checkpoint(out, model.state_dict(), meta), [], 0.0)


def entry_for(config: TrainConfig) -> ZooEntry:
    """The built-in model `config` trains; PipelineError, saying what to do, for any other."""
    if is_external(config.model):
        raise PipelineError(
            f"{config.model!r} is not a zoo model, so `pipeline train` has no task for it. Train it "
            "in your own code, save `model.state_dict()` with torch.save, and export it with "
            f"`pipeline export --model {config.model} --weights FILE` (or --random-init); "
            "docs/own-model.md walks it through export, verify, serving and a request."
        )
    try:
        return resolve_entry(config.model, kwargs=config.model_kwargs)
    except UnknownModelError as err:  # its "your own model can be given as" is export's offer
        said = str(err).split("; your own model can be given as")[0]
        raise UnknownModelError(
            f"{said}. `pipeline train` trains these built-in models only; your own model is "
            "trained in your code and exported with `pipeline export --weights FILE` "
            "(docs/own-model.md)."
        ) from None


def train(config: TrainConfig, refused: str | None = None) -> TrainResult:
    """Train `config.model` and write its checkpoint (and resumable state) atomically.

    Under `torchrun` every rank runs this; DistributedDataParallel keeps the
    replicas in step, metrics are summed across ranks and only rank 0 writes.
    `--batch-size` is the global batch: each of N ranks takes batch_size / N.
    `refused`: what this rank's caller found wrong, said to every rank.
    """
    world = distributed.from_env()
    device = resolve_device(config.device)
    if device.type == "cuda" and world.distributed:
        device = torch.device("cuda", world.local_rank)  # one GPU per process
    # A rank's own refusal is said to every rank once the group is up: raised before it,
    # it ended this launcher's processes only, and another machine's waited in the group's
    # rendezvous for half an hour with nothing printed.
    problem, settings = refused, {}
    try:
        entry = entry_for(config)
        config = config.resolved(dict(entry.train_defaults))
        config.validate()
        out = Path(config.out) if config.out else paths.checkpoint_path(entry.name)
        guard.check_out(out)
        if config.batch_size % world.size:
            raise PipelineError(
                f"--batch-size {config.batch_size} is the global batch and must divide evenly "
                f"over {world.size} processes."
            )
        settings = guard.agreed_settings(config, entry, world)
    except PipelineError as err:
        if not world.distributed:
            raise
        problem = problem or str(err)
    distributed.setup(world, device)
    lock = guard.OutputLock(out) if problem is None else None
    try:
        if world.is_main and lock is not None:  # the one process that writes
            try:
                lock.acquire()
            except PipelineError as err:
                problem = str(err)
        distributed.agree(world, settings, problem)
        return _train(config, entry, world, device, out)
    finally:
        if lock is not None:
            lock.release()
        distributed.teardown(world)


def _train(
    config: TrainConfig,
    entry: ZooEntry,
    world: distributed.World,
    device: torch.device,
    out: Path,
) -> TrainResult:
    task = get_task(entry.task) if entry.task else None
    generator = seed_everything(config.seed)  # the same seed on every rank: identical replicas
    model = entry.build().to(device)
    if task is None:
        if world.is_main:
            return _initial_checkpoint(config, entry.name, dict(entry.kwargs), model, out, device)
        return TrainResult(Checkpoint(out, {}, {}), [], 0.0)

    train_set, val_set = task.datasets(entry.name)
    local_batch = config.batch_size // world.size
    note = guard.equivalence_note(len(train_set), config.batch_size, world.size)
    if note and world.is_main:
        tqdm.write(f"note: {note}")
    # DistributedSampler in every mode: its order depends only on (seed, epoch),
    # so one process over batch B sees exactly the union of what N processes
    # see over batches B/N (unless the note above says otherwise), and a resumed
    # run picks up the same order.
    sampler = DistributedSampler(
        train_set, num_replicas=world.size, rank=world.rank, shuffle=True, seed=config.seed
    )
    train_loader = DataLoader(
        train_set,
        batch_size=local_batch,
        sampler=sampler,
        num_workers=config.workers,
        generator=generator,
        worker_init_fn=seed_worker,
        # A last batch of one sample would break BatchNorm1d in train mode.
        drop_last=len(sampler) % local_batch == 1,
        persistent_workers=config.workers > 0,
    )
    # Validation shards without DistributedSampler's padding, so the summed
    # metrics cover every validation sample exactly once.
    val_shard = Subset(val_set, range(world.rank, len(val_set), world.size))
    val_loader = DataLoader(val_shard, batch_size=256)
    net: torch.nn.Module = model
    if world.distributed:
        net = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config.lr, total_steps=config.epochs * len(train_loader)
    )
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    # GradScaler only for fp16: bf16 has fp32's exponent range, so no underflow to undo.
    scaler = torch.amp.GradScaler(device.type, enabled=config.amp and amp_dtype == torch.float16)

    history: list[dict[str, float]] = []
    start_epoch = 1
    state_file = train_state.state_path(out)
    if config.resume:
        state = train_state.load_state(state_file)
        ours = {"model": entry.name, **guard.resume_key(config, world)}
        # A state from before a setting joined the key does not say what it was: not judged
        # (assuming the default refused a run resumed with the very flag it started with).
        theirs = {"model": state["model_name"], **state["config"]}
        changed = {k: (theirs[k], v) for k, v in ours.items() if k in theirs and theirs[k] != v}
        if changed:
            shown = ", ".join(
                f"{k}: {old!r} then, {new!r} now" for k, (old, new) in changed.items()
            )
            raise PipelineError(
                f"Cannot resume from {state_file}: the run was started with other settings ({shown}). "
                "Resume with the same settings, or start a new run without --resume."
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        train_state.restore_rng(state["rng"], generator)
        history = list(state["history"])
        threads = state.get("intra_op_threads")
        if world.is_main and threads not in (None, torch.get_num_threads()):
            tqdm.write(
                f"note: the run was started with {threads} intra-op threads and resumes with "
                f"{torch.get_num_threads()}; its weights will not be byte-identical to an "
                f"uninterrupted run's (resume with OMP_NUM_THREADS={threads} for that)"
            )
        start_epoch = int(state["epoch"]) + 1
        if world.is_main:
            tqdm.write(
                f"resuming {entry.name} after epoch {state['epoch']} from {state_file}"
                if start_epoch <= config.epochs
                else f"{entry.name} finished all {config.epochs} epochs already ({state_file}); "
                "nothing left to train"
            )

    summary = ""
    if config.report and world.is_main:
        # Not through a DataLoader: creating its iterator draws from the global RNG.
        example = default_collate([val_set[0], val_set[1]])
        inputs, _ = task.prepare([t.to(device) for t in example])
        summary = train_report.model_summary(model, inputs)
        atomic_write(out.with_suffix(".summary.txt"), lambda tmp: tmp.write_text(summary + "\n"))
        tqdm.write(summary)

    started = drawn = time.perf_counter()
    completed = True
    plot = None
    checkpoint = None
    for epoch in range(start_epoch, config.epochs + 1):
        sampler.set_epoch(epoch)
        net.train()
        running = [0.0, 0.0]  # loss × samples, samples (this rank)
        bar = tqdm(
            train_loader,
            desc=f"epoch {epoch}/{config.epochs}",
            unit="batch",
            leave=False,
            # None: tqdm's own test, off where stderr is no terminal (a CI log, a pipe),
            # which carriage returns would fill.
            disable=True if not (config.progress and world.is_main) else None,
        )
        for batch in bar:
            inputs, targets = task.prepare([t.to(device) for t in batch])
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=config.amp):
                loss = task.loss(net(*inputs), targets)
            # The documented order: scale → backward → (unscale → clip) → step → update.
            scaler.scale(loss).backward()
            if config.clip_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            running[0] += loss.item() * targets.shape[0]
            running[1] += targets.shape[0]
            bar.set_postfix(loss=f"{running[0] / running[1]:.4f}")
        loss_sum, seen = distributed.all_sum(running, device, world)
        # The bare model, not the DDP wrapper: evaluation needs no gradient sync, and
        # DDP's buffer broadcast would deadlock if shards had different batch counts.
        val_sums = distributed.all_sum(
            evaluate_sums(model, val_loader, task, device), device, world
        )
        metrics = {
            "epoch": epoch,
            "train_loss": loss_sum / seen,
            **metrics_from_sums(task, val_sums),
        }
        history.append(metrics)
        if world.is_main:
            shown = "  ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k != "epoch")
            tqdm.write(f"epoch {epoch}/{config.epochs}  {shown}")
            checkpoint = _write_epoch(
                config,
                entry,
                task.name,
                model,
                optimizer,
                scheduler,
                scaler,
                generator,
                history,
                epoch,
                out,
                device,
                world,
                time.perf_counter() - started,
            )
            last = epoch == config.epochs or config.stop_after_epoch == epoch
            # Drawn at the end, and on the way for a long run: a plot costs about 0.3 s
            # of CPU, a quarter of a digits epoch (it was drawn after every epoch).
            if config.report and (last or time.perf_counter() - drawn >= PLOT_EVERY_S):
                plot = train_report.plot_history(
                    history, out.with_suffix(".png"), f"{entry.name} ({task.description})"
                )
                drawn = time.perf_counter()
        distributed.barrier(world)
        if config.stop_after_epoch == epoch and epoch < config.epochs:
            completed = False
            if world.is_main:
                tqdm.write(f"stopped after epoch {epoch} as asked; continue with --resume")
            break

    seconds = time.perf_counter() - started
    if checkpoint is None and world.is_main and out.is_file():  # a finished run resumed
        checkpoint = load_checkpoint(out)
    if checkpoint is None:  # a non-main rank
        checkpoint = Checkpoint(out, {}, {})
    if world.is_main:
        log.info("wrote %s (sha256 %s)", out, checkpoint.meta.get("weights_sha256"))
    return TrainResult(checkpoint, history, seconds, completed, plot, summary)


def _write_epoch(
    config: TrainConfig,
    entry: ZooEntry,
    task_name: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    generator: torch.Generator,
    history: list[dict[str, float]],
    epoch: int,
    out: Path,
    device: torch.device,
    world: distributed.World,
    seconds: float,
) -> Checkpoint:
    """The checkpoint (weights stay float32 whatever --amp did) and the resumable state."""
    meta: dict[str, Any] = {
        "model": {"name": entry.name, "kwargs": dict(entry.kwargs)},
        "task": task_name,
        "seed": config.seed,
        "epochs": config.epochs,
        "epoch": epoch,
        "metrics": {**{k: v for k, v in history[-1].items() if k != "epoch"}, "history": history},
        "train_config": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()
        },
        "device": str(device),
        "world_size": world.size,
        "amp": config.amp,
        # Bytes repeat only at the same intra-op thread count (torchrun sets 1).
        "intra_op_threads": torch.get_num_threads(),
    }
    checkpoint = save_checkpoint(
        out,
        {k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()},
        meta,
    )
    train_state.save_state(
        train_state.state_path(out),
        {
            "model_name": entry.name,
            "config": guard.resume_key(config, world),
            "epoch": epoch,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": train_state.capture_rng(generator),
            "history": history,
            "seconds": seconds,
            "intra_op_threads": torch.get_num_threads(),
        },
    )
    return checkpoint
