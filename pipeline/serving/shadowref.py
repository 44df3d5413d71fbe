"""The shadow check's reference process (issue 41): each sampled request, re-run on the
float32 eager model from the export's checkpoint and compared under the export's own rule.

Started by a worker (pipeline.runtimes.kserve.shadow; TorchServe's handler:
pipeline_runtime.handlershadow) as a process of its own, so a torch-free worker stays
torch-free and a slow check never touches the hot path. It reads
samples from a bounded queue, never faster than `max_rate` a second (it sleeps between
them; meanwhile the queue fills and the worker drops, and counts, what does not fit),
runs at a lower priority with one intra-op thread, and sends back one verdict per
sample. A divergent one is logged as a WARNING and kept in `<run dir>/shadow/`
(bounded) with the command that replays it through `pipeline verify`.

The rules are verify's:
* float32: elementwise, |served - eager| <= atol + rtol * |eager| with the manifest's
  tolerance; the error's share of its allowance is the largest element's;
* int8/float16: per request, top-1 agreement for a classifier and the score bound, the
  SQNR of its outputs against the floor the export recorded; the share is the noise's
  power against the floor's allowance (10^((floor - SQNR) / 10)), > 1 past the floor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from pipeline_runtime.shadowwire import READY, Sample, Verdict

__all__ = ["READY", "Sample", "Verdict", "check", "keep", "replay_command", "run"]

log = logging.getLogger("pipeline.serving.shadow")

KEEP_MAX = 20  # divergent samples kept per run folder
KEEP_MAX_BYTES = 16 * 2**20  # a sample bigger than this is logged, not kept
SHADOW_DIR = "shadow"


def run(
    samples: Any,
    verdicts: Any,
    run_dir: str,
    max_rate: float,
    threads: int,
    export_dirs: tuple[str, ...] = (),
) -> None:
    """The process's loop (multiprocessing target): until it reads None. `export_dirs`:
    the references loaded before it says READY, so their cost (torch's import, the eager
    model) is paid while the worker starts, not while it serves."""
    with contextlib.suppress(OSError):
        os.nice(10)  # behind the workers for the CPU
    import torch

    from pipeline.export.opened import open_export

    torch.set_num_threads(max(1, threads))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    references: dict[str, Any] = {}
    for export_dir in export_dirs:
        try:
            references[export_dir] = open_export(Path(export_dir))
        except Exception as err:  # noqa: BLE001 - its samples say so, one failed check each
            log.warning("shadow check: no reference for %s: %s", export_dir, err)
    verdicts.put(READY)
    gap = 1.0 / max_rate if max_rate > 0 else 0.0
    last = 0.0
    parent = os.getppid()
    while True:
        try:
            sample = samples.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the worker was killed: no one to answer
                return
            continue
        if sample is None:
            return
        wait = last + gap - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        last = time.monotonic()
        try:
            verdict = check(sample, references, Path(run_dir))
        except Exception as err:  # one bad sample must not stop the checks (logged with it)
            log.exception("shadow check of %s failed", sample.model)
            verdict = Verdict(
                sample.model,
                sample.version,
                sample.format,
                False,
                0.0,
                error=f"{type(err).__name__}: {err}",
            )
        verdicts.put(verdict)


def check(sample: Sample, references: dict[str, Any], run_dir: Path) -> Verdict:
    """One sample against eager, under its format's rule; a divergence logged and kept."""
    import torch

    from pipeline.export.opened import open_export
    from pipeline.formats import base as registry

    exported = references.get(sample.export_dir)
    if exported is None:
        exported = references[sample.export_dir] = open_export(Path(sample.export_dir))
    manifest = exported.manifest
    inputs = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sample.inputs.items()}
    eager = [t.detach().cpu().numpy() for t in exported.eager(inputs).values()]
    if registry.precision_of(sample.format) == registry.FLOAT32:
        share, what = _elementwise(manifest, eager, sample.outputs)
    else:
        share, what = _task_level(manifest, sample.format, eager, sample.outputs)
    verdict = Verdict(sample.model, sample.version, sample.format, share > 1.0, share, what)
    if verdict.diverged:
        verdict.kept = keep(run_dir, sample, eager, what)
        log.warning(
            "shadow check: %s version %s (%s) diverged from eager: %s; request id %s, "
            "trace id %s; kept in %s",
            sample.model,
            sample.version,
            sample.format,
            what,
            sample.request_id or "-",
            sample.trace_id or "-",
            verdict.kept or "(not kept: the folder is full)",
        )
    return verdict


def _elementwise(
    manifest: Any, eager: list[np.ndarray], served: list[np.ndarray]
) -> tuple[float, str]:
    atol, rtol = manifest.tolerance.atol, manifest.tolerance.rtol
    worst, said = 0.0, ""
    for name, ref, got in zip(manifest.output_names, eager, served, strict=False):
        got = np.asarray(got)
        if got.shape != ref.shape:
            return math.inf, f"output {name!r} has shape {list(got.shape)}, eager {list(ref.shape)}"
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        odd = ~np.isfinite(ref64)
        if (odd != ~np.isfinite(got64)).any() or not np.array_equal(
            ref64[odd], got64[odd], equal_nan=True
        ):
            return math.inf, f"output {name!r} is NaN or Inf where eager's is not, or the reverse"
        # The same NaN or Inf as eager's (a finite input that overflows the model itself):
        # no divergence of the served artifact; its finite elements are compared.
        ref64, got64 = np.where(odd, 0.0, ref64), np.where(odd, 0.0, got64)
        err = np.abs(got64 - ref64)
        allowed = atol + rtol * np.abs(ref64)
        used = np.where(
            allowed > 0, err / np.where(allowed > 0, allowed, 1), np.where(err > 0, np.inf, 0)
        )
        at = int(np.argmax(used)) if used.size else 0
        if used.size and float(used.flat[at]) > worst:
            worst = float(used.flat[at])
            said = (
                f"output {name!r}: max |error| {float(err.max()):.3g} at element {at} uses "
                f"{worst:.2f}× its allowance (atol {atol:g} + rtol {rtol:g}·|eager|)"
            )
    return worst, said


def _task_level(
    manifest: Any, fmt: str, eager: list[np.ndarray], served: list[np.ndarray]
) -> tuple[float, str]:
    import torch

    from pipeline.core.budget import Budget
    from pipeline.core.tasklevel import sqnr_db
    from pipeline.formats import base as registry

    record = manifest.artifacts.get(fmt)
    floor = Budget.from_json(record.get("budget") if record else None).sqnr_for(
        registry.precision_of(fmt)
    )
    worst, said = 0.0, ""
    classifier = bool(manifest.serving.topk)
    for name, ref, got in zip(manifest.output_names, eager, served, strict=False):
        got = np.asarray(got, dtype=np.float64)
        if got.shape != ref.shape:
            return math.inf, f"output {name!r} has shape {list(got.shape)}, eager {list(ref.shape)}"
        if classifier and ref.ndim == 2:
            agree = ref.argmax(axis=1) == got.argmax(axis=1)
            if not agree.all():
                return math.inf, (
                    f"output {name!r}: top-1 differs from eager's on "
                    f"{int((~agree).sum())} of {agree.size} samples"
                )
        sqnr = sqnr_db(torch.from_numpy(ref.astype(np.float64)), torch.from_numpy(got))
        share = 0.0 if sqnr == math.inf else 10 ** ((floor - sqnr) / 10)
        if share > worst:
            worst, said = (
                share,
                f"output {name!r}: SQNR {sqnr:.1f} dB against the floor {floor:g} dB",
            )
    return worst, said


def keep(run_dir: Path, sample: Sample, eager: list[np.ndarray], what: str) -> str:
    """The sample's inputs and both answers, and how to replay it; "" past the bound."""
    folder = run_dir / SHADOW_DIR
    folder.mkdir(exist_ok=True)
    if len(list(folder.glob("*.answers.npz"))) >= KEEP_MAX:  # one per sample (not replays')
        return ""
    size = sum(a.nbytes for a in (*sample.inputs.values(), *sample.outputs, *eager))
    if size > KEEP_MAX_BYTES:
        return ""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{sample.model}-v{sample.version}-{sample.format}")
    stem = (
        folder
        / f"{slug}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    )
    with stem.with_suffix(".npz").open("wb") as fh:  # the inputs alone: verify --inputs reads it
        np.savez(fh, **sample.inputs)
    with Path(f"{stem}.answers.npz").open("wb") as fh:
        np.savez(
            fh,
            **{f"served_{i}": o for i, o in enumerate(sample.outputs)},
            **{f"eager_{i}": o for i, o in enumerate(eager)},
        )
    about = asdict(sample) | {"inputs": sorted(sample.inputs), "outputs": len(sample.outputs)}
    about |= {"what": what, "replay": replay_command(sample, stem.with_suffix(".npz"))}
    stem.with_suffix(".json").write_text(json.dumps(about, indent=2) + "\n")
    return str(stem.with_suffix(".npz"))


def replay_command(sample: Sample, npz: Path) -> str:
    from pipeline.formats import base as registry

    backend = registry.get(sample.format).backend
    model = _manifest_model(Path(sample.export_dir))
    # Its own report beside the sample: the default (<artifacts>/<model>/parity.json) is the
    # export's own, which `pipeline publish` reads as the export's passing verify.
    report = npz.with_name(npz.stem + ".parity.json")
    return (
        f"pipeline verify --model {model} --export-dir {sample.export_dir} "
        f"--backend {backend} --inputs {npz} --report {report}"
    )


def _manifest_model(export_dir: Path) -> str:
    from pipeline_runtime.manifest import Manifest

    return Manifest.read(export_dir).model.name
