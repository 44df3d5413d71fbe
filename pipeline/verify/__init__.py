"""The verify stage: every backend against eager PyTorch on the same inputs."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.core import paths
from pipeline.core.budget import DEFAULT_ACCURACY_BUDGET, Budget
from pipeline.core.compare import VACUOUS_FRACTION
from pipeline.core.errors import ArtifactError, PipelineError
from pipeline.core.fileio import write_json
from pipeline.export.opened import ExportedModel, open_export
from pipeline.export.quality import random_cases
from pipeline.formats import base as registry
from pipeline.verify.backends import (
    CPP,
    Backend,
    Builds,
    backend_names,
    load_backends,
    local_backends,
    where,
)
from pipeline.verify.check import Tol, check_cases, check_task, reduced, runs_on, skipped_notes
from pipeline.verify.locate import locate_failures
from pipeline.verify.page import write_page
from pipeline.verify.report import ParityReport, Row
from pipeline.zoo import DEFAULT_MODEL
from pipeline.zoo.spec import Inputs

log = logging.getLogger(__name__)

__all__ = ["ParityReport", "VerifyConfig", "backend_names", "verify"]


@dataclass
class VerifyConfig:
    model: str = DEFAULT_MODEL
    export_dir: Path | None = None  # default: artifacts/<model>/export
    checkpoint: Path | None = None  # default: the one recorded in the manifest
    # None: the in-process backend of every format the export holds. Served
    # backends (a runtime's name, e.g. "torchserve") are built by the caller and passed
    # to verify(); `served_names` says which names those are.
    backends: tuple[str, ...] | None = None
    served_names: tuple[str, ...] = ()
    with_cpp: bool = False  # with the default backends: the C++ client too, on every format it runs
    cpp_binary: Path | None = None  # default: cpp_client/build/run_torchscript, built if needed
    # --cpp-build-dir: where the LibTorch client is built, once a format it runs is checked;
    # --pte-build-dir: the same for ExecuTorch's runner (default: each program's own folder).
    cpp_build_dir: Path | None = None
    pte_build_dir: Path | None = None
    atol: float | None = None  # default: the manifest's tolerance
    rtol: float | None = None
    # atol as a fraction of each output's largest reference magnitude (replaces atol).
    atol_scale: float | None = None
    allow_vacuous: bool = False  # accept tolerances that cannot tell the reference from zeros
    bisect: bool = False  # also write the smallest failing ONNX subgraph
    page: bool = True  # write the Markdown report with histograms beside the JSON
    batch_sizes: tuple[int, ...] = (1, 7)
    inputs: tuple[Path, ...] = ()  # .npz files of named inputs checked too (--inputs)
    seed: int = 0
    report: Path | None = None  # default: artifacts/<model>/parity.json
    # The int8/float16 formats' bounds (pipeline/verify/task.py); None: the budget export
    # recorded for each artifact.
    accuracy_budget: float | None = None
    min_sqnr: float | None = None
    # Where the in-process backends and the C++ client run ("cpu", "cuda", "cuda:N"); eager,
    # the reference, runs on CPU.
    device: str = "cpu"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VerifyConfig:
        """The config `pipeline verify` ARGS describe."""
        return cls(
            model=args.model,
            export_dir=args.export_dir or paths.export_dir(args.model, args.artifacts_dir),
            checkpoint=args.checkpoint,
            backends=tuple(args.backend) if args.backend else None,
            served_names=tuple(getattr(args, "served_names", ())),
            with_cpp=args.with_cpp,
            cpp_build_dir=getattr(args, "cpp_build_dir", None),
            pte_build_dir=getattr(args, "pte_build_dir", None),
            atol=args.atol,
            rtol=args.rtol,
            atol_scale=args.atol_scale,
            allow_vacuous=args.allow_vacuous,
            bisect=args.bisect,
            batch_sizes=tuple(args.batch_sizes),
            inputs=tuple(getattr(args, "inputs", ()) or ()),
            seed=args.seed,
            report=args.report
            or paths.report_path(args.model, args.artifacts_dir, args.export_dir),
            accuracy_budget=args.accuracy_budget,
            min_sqnr=args.min_sqnr,
            device=args.device,
        )

    def validate(self, served: Sequence[Backend] = ()) -> None:
        """`served`: the backends handed to verify(); their runtime names count as known."""
        known = (*backend_names(), *_served_names(self, served))
        unknown = [b for b in self.backends or () if b not in known]
        if unknown:
            raise PipelineError(
                f"Unknown backend(s) {', '.join(unknown)}; choose from {', '.join(known)}."
            )
        if self.atol is not None and self.atol_scale is not None:
            # The scale replaces the absolute tolerance: the rows used it while the report's
            # footer printed both.
            raise PipelineError("Give --atol or --atol-scale, not both: the scale replaces --atol.")
        if self.accuracy_budget is not None or self.min_sqnr is not None:
            Budget(
                DEFAULT_ACCURACY_BUDGET if self.accuracy_budget is None else self.accuracy_budget,
                self.min_sqnr,
            ).validate()
        if any(b < 1 for b in self.batch_sizes):
            raise PipelineError("--batch-sizes must all be at least 1.")
        self.device = _device(self.device)
        for name in ("atol", "rtol", "atol_scale"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                flag = name.replace("_", "-")
                raise PipelineError(f"--{flag} must be finite and non-negative, got {value}.")
        if self.atol_scale is not None and self.atol_scale >= VACUOUS_FRACTION:
            raise PipelineError(
                f"--atol-scale {self.atol_scale:g} allows at least {VACUOUS_FRACTION:g} of each "
                "output's largest value: such a check cannot tell the output from zeros. "
                f"Use a value below {VACUOUS_FRACTION:g}, e.g. 1e-4."
            )


def _cases(
    exported: ExportedModel, config: VerifyConfig
) -> list[tuple[str, Inputs, dict[str, torch.Tensor] | None]]:
    """(label, inputs, stored golden outputs or None) for every input set.

    Golden and probe inputs are the ones export stored (so every backend, the
    C++ client included, sees the same tensors); fresh random batches are
    drawn here from the input spec.
    """
    entry = exported.entry
    golden_inputs, golden_outputs = exported.golden()
    cases: list[tuple[str, Inputs, dict[str, torch.Tensor] | None]] = [
        ("golden", golden_inputs, golden_outputs)
    ]
    cases += [(f"probe {label}", inputs, None) for label, inputs in exported.probes()]
    cases += [
        (label, inputs, None)
        for label, inputs in random_cases(entry, config.batch_sizes, config.seed)
    ]
    cases += [(f"file {Path(f).name}", kept_inputs(Path(f), exported), None) for f in config.inputs]
    # An artifact compiled for one size of an axis (--fix-axis) gets inputs of that size.
    generator = torch.Generator().manual_seed(config.seed + 1)
    for sizes in {tuple(sorted(f.items())) for f in _fixed_sizes(exported)}:
        label = "random " + " ".join(f"{a}={n}" for a, n in sizes) + " (a fixed axis)"
        cases.append((label, entry.sample_inputs(entry.sizes(**dict(sizes)), generator), None))
    return cases


def kept_inputs(path: Path, exported: ExportedModel) -> Inputs:
    """A .npz of named inputs (`--inputs`), checked against the manifest's input names."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {k: torch.from_numpy(saved[k].copy()) for k in saved.files}
    except (OSError, ValueError) as err:
        raise PipelineError(f"--inputs {path}: not a readable .npz of arrays ({err}).") from None
    names = exported.manifest.input_names
    if sorted(arrays) != sorted(names):
        raise PipelineError(f"--inputs {path} holds {sorted(arrays)}; the model takes {names}.")
    return {n: arrays[n] for n in names}


def _device(name: str) -> str:
    """--device as the backends take it: "cpu" or "cuda:N" (PipelineError when that CUDA
    device is not here)."""
    from pipeline.core.device import resolve_indexed

    return str(resolve_indexed(name))


def _fixed_sizes(exported: ExportedModel) -> list[dict[str, int]]:
    return [
        dict(a.get("fixed_axes"))
        for a in exported.manifest.artifacts.values()
        if a.get("fixed_axes")
    ]


def _served_names(config: VerifyConfig, served: Sequence[Backend]) -> tuple[str, ...]:
    # A served backend is named "<runtime>/<format>": a library caller that hands verify()
    # its backends need not also list the runtime in served_names.
    named = {b.name.split("/", 1)[0] for b in served if "/" in b.name}
    return (*config.served_names, *sorted(named - set(config.served_names)))


def _load(
    name: str, exported: ExportedModel, config: VerifyConfig, tol: Tol
) -> tuple[list[Backend], list[Row]]:
    """Backend `name`'s backends, or for a reduced-precision format that cannot run here
    (a float16 graph the CPU provider refuses) a failed row saying so plainly."""
    fmt = registry.by_backend(name)
    if fmt is None or fmt.precision == registry.FLOAT32:
        return load_backends(name, exported, config.cpp_binary, config.device, _builds(config)), []
    try:
        return load_backends(name, exported, config.cpp_binary, config.device, _builds(config)), []
    except ArtifactError:
        raise  # missing, altered or never written: not a question of where it runs
    except Exception as err:  # noqa: BLE001 - reported as this backend's failed check
        why = " ".join(str(err).split())[:300]
        problem = RuntimeError(
            f"{fmt.title} cannot run here ({why}); it was not verified on this machine: "
            "verify it where a runtime provider that runs it is available (a GPU for float16)"
        )
        names = exported.manifest.output_names
        return [], [Row.crashed(name, "task level", n, problem, tol.atol, tol.rtol) for n in names]


def open_for(config: VerifyConfig) -> ExportedModel:
    """The export `config` checks, opened (manifest, eager model, checkpoint)."""
    export_dir = Path(config.export_dir) if config.export_dir else paths.export_dir(config.model)
    return open_export(export_dir, model=config.model, checkpoint=config.checkpoint)


def verify(
    config: VerifyConfig,
    served: Sequence[Backend] = (),
    exported: ExportedModel | None = None,
) -> ParityReport:
    """Compare every backend with eager on every case; write the JSON and Markdown reports.

    `served`: backends of a running server (`pipeline.serving.backends`), checked
    like the in-process ones. Returns the report; the caller decides what a
    failure does (the CLI exits 1; `report.raise_for_failures()` raises the
    typed error). `exported`: the export, already opened by the caller (`open_for`).
    """
    config.validate(served)
    served_names = _served_names(config, served)
    exported = exported or open_for(config)
    export_dir = exported.dir
    manifest = exported.manifest
    tol = Tol(
        config.atol if config.atol is not None else manifest.tolerance.atol,
        config.rtol if config.rtol is not None else manifest.tolerance.rtol,
        config.atol_scale,
        config.allow_vacuous,
    )
    for name in config.backends or ():
        if name in served_names and not any(b.name.startswith(f"{name}/") for b in served):
            raise PipelineError(
                f"--backend {name} needs a running server that serves this model: start one "
                f"with `pipeline serve --runtime {name}`."
            )
    wanted = config.backends or (*local_backends(exported), *((CPP,) if config.with_cpp else ()))
    backends: list[Backend] = []
    unloadable: list[Row] = []
    for name in wanted:
        if name not in served_names:
            loaded, failed = _load(name, exported, config, tol)
            backends += loaded
            unloadable += failed
    backends += served

    cases = _cases(exported, config)
    for backend in backends:
        prepare = getattr(backend, "prepare", None)
        if prepare is not None:  # backends that run every case in one go (the C++ client)
            try:
                prepare([i for _, i, _ in cases if runs_on(exported, backend, i)])
            except Exception as err:  # noqa: BLE001 - reported per case below, via run()
                log.warning("%s could not run all cases at once: %s", backend.name, err)
    # float32 backends elementwise; int8/float16 ones by what the model still gets right.
    checked = check_cases(exported, [b for b in backends if not reduced(b)], cases, tol)
    checked.rows += unloadable
    task_level = [b for b in backends if reduced(b)]
    if task_level:
        checked.notes += skipped_notes(exported, task_level, cases)
        checked.rows += check_task(
            exported, task_level, cases, tol, config.accuracy_budget, config.min_sqnr
        )
    report_path = Path(config.report or paths.report_path(exported.name, export=export_dir))
    report = ParityReport(
        model=exported.name,
        export_dir=str(export_dir),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        tolerance=tol.to_json()
        | (
            {"accuracy_budget": config.accuracy_budget, "min_sqnr": config.min_sqnr}
            if task_level
            else {}
        ),
        artifacts={
            k: {
                kk: v
                for kk, v in a.to_json().items()
                if kk in ("file", "method", "exporter", "opset", "reason", "precision")
            }
            for k, a in manifest.artifacts.items()
        },
        rows=checked.rows,
        notes=checked.notes
        + [
            f"{key} was not checked: export could not write it ({_whole(why)})"
            for key, why in exported.manifest.unwritten.items()
        ],
    )
    for key, art in manifest.artifacts.items():
        if art.reason.startswith("UNSAFE") and any(b.format_key == key for b in backends):
            # A kept unsafe trace follows one branch: it passes wherever the inputs take it.
            report.notes.append(
                f"{key} is an UNSAFE trace (--allow-unsafe-trace): it computes the branch its "
                "example took; passing here shows only that these inputs took it. Give "
                "--probes that drive each branch (export takes them too)."
            )
    if config.device != "cpu":  # where each ran: a format without a CUDA path stays on CPU
        ran = ", ".join(f"{b.name} on {where(b)}" for b in backends if where(b))
        report.notes.append(f"--device {config.device} (eager, the reference, on CPU): {ran}")
    for backend in backends:  # a format's own C++ runner: what it is and what it weighs
        describe = getattr(getattr(backend, "program", None), "describe", None)
        if describe is not None and getattr(backend, "binary", None) is not None:
            report.notes.append(f"{backend.name}: {describe(backend.binary)}")
    from pipeline.core import signing

    if signing.is_version(export_dir):  # a store's version: who signed it
        signed = signing.state(export_dir)
        report.signature = signed.to_json()
        report.notes.append(f"this version of the store is {signed.describe()}")
    if not report.passed:
        bisect_dir = report_path.with_name(report_path.stem + "_bisect") if config.bisect else None
        report.localisations = locate_failures(exported, backends, checked, tol, bisect_dir)
    if config.page:
        report.page = write_page(report, report_path.with_suffix(".md"))
    write_json(report_path, report.to_json())
    report.path = report_path
    return report


def _whole(reason: str, most: int = 1000) -> str:
    """Export's reason on one line, its hint kept: cut, at a word, only past `most`."""
    return textwrap.shorten(reason, most, placeholder=" …")


def _builds(config: VerifyConfig) -> Builds:
    return Builds(config.cpp_build_dir, config.pte_build_dir)
