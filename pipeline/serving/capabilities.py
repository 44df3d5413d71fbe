"""What a runtime may offer beyond the core (pipeline.serving.runtime.Runtime).

The core is what every runtime must do. Each capability here is an object a runtime
holds or does not: `Runtime.versions`, `.shadow`, `.bench_report`, `.deploy`,
`.packaging`, `.commands` and `.nodes` are None when the runtime does not offer it, which is the one way a
runtime says "not supported" (the commands that need one refuse, naming the runtime).
A runtime implements only what it offers, as KServe's Python server leaves a model's
`explain` out, and LitServe's `LitSpec` adds routes to a `LitAPI` only where one asks.

This module stays light: the CLI reads capabilities to build its help.
"""

from __future__ import annotations

import abc
import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.serving.live import LiveState, Tally
    from pipeline.serving.server import Server


@dataclass(frozen=True)
class PrivateSettings:
    """What bench and loadtest may ask of `Runtime.private` beyond the model and format.

    `tuned_in`: a bench folder whose findings (bench with `BenchSettings.tune`) the
    server follows, as `pipeline serve`'s does. `workers`, `threads`: process and intra-op
    thread counts (None: the runtime's defaults). `shadow_rate`: the live shadow check's
    share of requests, only for a runtime with the `shadow` capability."""

    tuned_in: Path | None = None
    workers: int | None = None
    threads: int | None = None
    shadow_rate: float = 0.0


# `Runtime.private`'s default: a shared instance (the dataclass is frozen).
DEFAULT_PRIVATE = PrivateSettings()


class Versions(abc.ABC):
    """Versions on a running server (`pipeline rollout`, `rollback`, `status`)."""

    @abc.abstractmethod
    def live_state(self, server: Server) -> LiveState | None:
        """The versions `server` serves now and where unversioned requests go (before any
        rollout, the ones it started with). None when this server was started without
        what versions need (TorchServe without --live-versions): rollout says so."""

    @abc.abstractmethod
    def apply_live(self, server: Server, state: LiveState, timeout_s: float) -> None:
        """Make `server` serve `state` (load new versions beside the old, move the split,
        drop what is gone once its requests finish); return when every worker does.
        pipeline.serving.live.LiveError when a worker could not."""

    def live_stats(self, server: Server) -> dict[tuple[str, int], Tally]:
        """Every worker's answers per (served name, version) since the server started: the
        tallies its processes wrote to the run folder (pipeline.serving.live)."""
        from pipeline.serving.live import read_stats

        return read_stats(Path(server.run_dir))


@dataclass(frozen=True)
class Shadow:
    """The live shadow check: `--shadow RATE` on `pipeline serve` (pipeline.serving.
    shadowopts), `PrivateSettings.shadow_rate` on a private server, counters on /metrics
    (`pipeline_shadow_*`). Present or absent, nothing more: bench measures its cost on
    each runtime that has it, and a private server without it refuses a rate."""


class BenchReport(abc.ABC):
    """What a runtime's bench adds to the shared report beyond its measured rows."""

    def notes(self, out_dir: Path) -> str:
        """Markdown for bench.md about what its bench found in `out_dir` beyond its rows
        (a settings sweep); a runtime whose bench sweeps nothing adds none."""
        return ""

    @abc.abstractmethod
    def targets(self, cells: list[dict], served: list[dict]) -> list[dict[str, Any]]:
        """Its performance targets over one bench run."""

    def split(self, metrics: str) -> dict[tuple[str, str], tuple[float, float]]:
        """Its /metrics text → (served name, stage) → (seconds summed, requests counted),
        the stages pipeline.bench.split.ORDER names, for each served row's server split;
        a runtime whose metrics have no stage totals reads none."""
        return {}


class Deploy(abc.ABC):
    """`pipeline deploy <runtime name>`: what a cluster needs to run this runtime."""

    @abc.abstractmethod
    def add_command(self, sub: argparse._SubParsersAction) -> None:
        """Add the `pipeline deploy` subcommand."""


class Commands(abc.ABC):
    """Top-level `pipeline` subcommands only this runtime has (TorchServe's `archive`)."""

    @abc.abstractmethod
    def add(self, sub: argparse._SubParsersAction, formats: list[str]) -> None:
        """Add the subcommands; `formats`: the format registry's keys (--format choices).
        Light: the CLI builds its help from them without importing torch."""


class Packaging(abc.ABC):
    """A deployable package of one format that another system's server runs: `deploy
    kserve` writes, beside the project's runtime, a layout for each runtime with one."""

    model_format: str  # KServe's `modelFormat` whose ServingRuntime runs the package

    @abc.abstractmethod
    def package(self, model: str, export_dir: Path, fmt: str, dest: Path) -> Path:
        """Write `fmt` of the export in `export_dir` into the folder `dest` (batch size 1);
        return the file."""

    def layout_files(self, name: str, *, envelope: bool = False) -> dict[str, str]:
        """The files the ServingRuntime reads beside package `name` (the package's file
        stem), by path relative to the layout's root → text; `envelope`: the server's own
        translation of KServe's v2 requests on. None beyond the package by default."""
        return {}


class Nodes(abc.ABC):
    """A runtime spread over a cluster's nodes, one of which can be lost: `loadtest
    --kill-node-after` kills a worker node that serves the model and reports how long
    until the model answered from the survivors. The cluster replaces a lost replica
    itself where it has room (Ray Serve's controller does: docs/ray.md)."""

    # What `loadtest --kill-worker-after` says on such a runtime when it does not declare
    # `Runtime.replaces_workers`: the refusal said it did not replace a killed worker and
    # that Kubernetes would, where the cluster replaces a killed replica itself.
    worker_kill_refused: str = (
        "it replaces a killed replica itself, but loadtest kills a single worker only on "
        "a runtime that declares it does; lose a node under load with --kill-node-after"
    )

    # Why `loadtest --serve --kill-node-after` is refused before its private server starts
    # (one without worker nodes to lose), with what to do instead; None: it may be asked.
    private_kill_refused: str | None = None

    @abc.abstractmethod
    def serving(self, server: Server, name: str) -> list[str]:
        """The ids of the nodes whose replicas serve `name` now."""

    @abc.abstractmethod
    def worker_nodes(self, server: Server, name: str) -> list[str]:
        """The ids of the live worker nodes (never the head) whose replicas serve `name`."""

    # What refuse_kill advises when too few worker nodes serve a model.
    more_nodes: str = "serve it on at least two worker nodes"

    def refuse_kill(self, server: Server, name: str) -> None:
        """ValueError unless at least two worker nodes serve `name`: killing the only one
        leaves nothing to answer, which tests no recovery and fails every request after."""
        count = len(self.worker_nodes(server, name))
        if count < 2:
            raise ValueError(
                f"{count} worker node(s) serve {name}, and a node is killed only while at "
                f"least two do (losing the last one leaves no replica to answer): {self.more_nodes}"
            )

    @abc.abstractmethod
    def kill_node(self, server: Server, name: str) -> str:
        """Kill one worker node (never the head) that serves `name`, as a machine is lost:
        its processes SIGKILLed. Returns the node's id. ValueError when the server has no
        such node (a one-node cluster, or one the runtime did not start)."""


def refuse_shadow(title: str, settings: PrivateSettings) -> None:
    """For a runtime without the shadow capability: a shadow rate is an error, not ignored."""
    if settings.shadow_rate > 0:
        raise ValueError(f"{title} has no live shadow check (shadow_rate must be 0)")
