"""Where each failing backend first departs from eager, and whom to blame for it.

An in-process backend is localised directly (pipeline/verify/localise.py). A backend out
of process (the C++ client, a served model) runs an artifact file it was handed: when
its check fails, the question is whether that file computes something else or the way
it is run and carried (the runtime, the transport) changes the answer. The answer comes
from running the file itself in process, never from assuming it: verify says "agrees
in-process" only when an in-process backend of that format ran in this check and passed.
When none ran (a rollout's live check hands verify only the served backends), the
artifact is loaded now, from the file as it is in the export folder or store, run on the
inputs the served check failed on, and localised when it differs too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.export.opened import ExportedModel
from pipeline.formats import base as registry
from pipeline.verify.backends import Backend, load_backends
from pipeline.verify.check import LOCALISABLE, Checked, Tol, check_cases
from pipeline.verify.report import Row

log = logging.getLogger(__name__)

# Who a finding blames (the localisation's "blame" field).
ARTIFACT = "artifact"
TRANSPORT = "runtime or transport"


def locate_failures(
    exported: ExportedModel,
    backends: Sequence[Backend],
    checked: Checked,
    tol: Tol,
    bisect_dir: Path | None,
) -> list[dict[str, Any]]:
    """Where each failing backend first departs from eager, one entry per backend.

    In-process backends are localised on the inputs of their first failing check, and
    first, so that an out-of-process backend of the same format gets that finding. An
    out-of-process backend whose format had no in-process backend in this check gets
    its artifact run in process now (`_read_the_bytes`)."""
    found: dict[str, dict[str, Any]] = {}  # format key → the in-process finding
    agreed: dict[str, str] = {}  # format key → how we know its artifact agrees
    out: list[dict[str, Any]] = []
    by_name = {b.name: b for b in backends}
    failing = list(dict.fromkeys(r.backend for r in checked.rows if not r.passed))
    failing.sort(key=lambda n: not getattr(by_name.get(n), "in_process", False))
    for name in failing:
        backend = by_name.get(name)
        fmt = getattr(backend, "format_key", None)
        # Task-level rows (int8, float16) differ from eager on purpose: nothing to localise.
        row = next(
            (
                r
                for r in checked.rows
                if r.backend == name and r.kind in LOCALISABLE and r.task is None
            ),
            None,
        )
        if backend is None or fmt is None or row is None:
            continue  # the golden file, or a backend that only crashed: its error says it all
        if getattr(backend, "in_process", False):
            loc = _localised(exported, fmt, name, row, checked, tol, bisect_dir)
            loc["line"] = f"{_line(loc)} (on the {row.inputs!r} inputs)"
            loc["blame"] = ARTIFACT
            found[fmt] = loc
        else:
            if fmt not in found and fmt not in agreed:
                twins = [b for b in backends if b.in_process and b.format_key == fmt]
                if twins:
                    if any(t.name in failing for t in twins):
                        agreed[fmt] = ""  # it failed without a finding: its rows say how
                    else:
                        agreed[fmt] = f"{twins[0].name} agrees with eager in this check"
                else:
                    _read_the_bytes(exported, fmt, row, checked, tol, bisect_dir, found, agreed)
            loc = _blamed(name, fmt, found, agreed)
        out.append(loc)
    return out


def _blamed(
    name: str, fmt: str, found: Mapping[str, dict[str, Any]], agreed: Mapping[str, str]
) -> dict[str, Any]:
    """An out-of-process backend's entry, from what is known of its artifact."""
    if fmt in found:
        loc = {**found[fmt], "backend": name, "blame": ARTIFACT}
        loc["line"] = f"{name} runs the same {fmt} artifact: {_line(found[fmt])}"
        return loc
    how = agreed.get(fmt)
    if how:
        note = (
            f"out of process; the same {fmt} artifact agrees with eager in-process ({how}), "
            "so the difference comes from this backend's runtime or transport"
        )
        return {"backend": name, "available": False, "blame": TRANSPORT, "note": note,
                "line": f"{name}: {note}"}  # fmt: skip
    note = (
        f"out of process; the in-process {fmt} backend failed as well without a finding "
        "(see its rows): artifact or runtime cannot be told apart"
    )
    return {"backend": name, "available": False, "note": note, "line": f"{name}: {note}"}


def _read_the_bytes(
    exported: ExportedModel,
    fmt: str,
    row: Row,
    checked: Checked,
    tol: Tol,
    bisect_dir: Path | None,
    found: dict[str, dict[str, Any]],
    agreed: dict[str, str],
) -> None:
    """Run artifact `fmt` as its file is now, in process, on the failing row's inputs;
    record in `found` where it departs (then the artifact is to blame) or in `agreed`
    that it does not (then the runtime or transport is)."""
    record = exported.manifest.artifacts.get(fmt)
    if record is None:
        return
    file = exported.dir / record.file
    twin_name = registry.get(fmt).backend
    log.info("no in-process %s ran: running %s in process on the %r inputs…", fmt, file, row.inputs)
    try:
        twin = load_backends(twin_name, exported)[0]
        rerun = check_cases(exported, [twin], [(row.inputs, checked.inputs[row.inputs], None)], tol)
    except Exception as err:  # any failure to run it is reported, not raised
        log.warning("could not run %s in process: %s", file, err, exc_info=True)
        found[fmt] = {
            "backend": twin_name,
            "available": False,
            "note": f"the {fmt} artifact {file} does not run in process: {err}",
            "line": f"the {fmt} artifact {file} does not run in process: {err}",
            "artifact": str(file),
        }
        return
    if all(r.passed for r in rerun.rows):
        agreed[fmt] = f"{file} as it is now, run in process on the {row.inputs!r} inputs"
        return
    loc = _localised(exported, fmt, twin_name, row, checked, tol, bisect_dir)
    loc["artifact"] = str(file)
    loc["describe"] = (
        f"the {fmt} artifact itself differs from eager: {file} as it is now, run in process "
        f"on the {row.inputs!r} inputs; {_line(loc)}"
    )
    found[fmt] = loc


def _localised(
    exported: ExportedModel,
    fmt: str,
    name: str,
    row: Row,
    checked: Checked,
    tol: Tol,
    bisect_dir: Path | None,
) -> dict[str, Any]:
    from pipeline.verify.localise import localise  # only when something failed

    log.info("localising %s on the %r inputs…", name, row.inputs)
    try:
        result = localise(
            exported,
            fmt,
            checked.inputs[row.inputs],
            row.atol,
            tol.rtol,
            bisect_dir=bisect_dir,
            backend=name,
        )
        return {**result.to_json(), "describe": result.describe()}
    except Exception as err:  # a localisation that fails is reported, not raised
        log.warning("could not localise %s: %s", name, err, exc_info=True)
        return {"backend": name, "available": False, "note": f"{name}: localisation failed: {err}"}


def _line(loc: Mapping[str, Any]) -> str:
    return str(loc.get("describe") or loc.get("note") or "no finding")
