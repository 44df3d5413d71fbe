"""Every torchvision detection builder at its defaults through the CLI, as a user runs it:
`pipeline export --model torchvision:<builder> --random-init` (TorchScript and ONNX),
then `pipeline verify`; prints one Markdown row per builder (issue 49's stored run).

    .venv/bin/python docs/measurements/detectors.py [BUILDER ...] > table.md

Each builder runs in a scratch folder with a time limit (--limit-s, default 900 s per
command); the firm share is eager's firm detections over all of them, summed over the
backends' rows of the parity report.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torchvision

from pipeline.formats import base

FORMATS = {f.key for f in base.all_formats()}


def _run(args: list[str], cwd: Path, limit: float) -> tuple[int | str, float, str]:
    began = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True,
            text=True, timeout=limit,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - began, ""
    return proc.returncode, time.perf_counter() - began, proc.stdout + proc.stderr


def _last_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(("error:", "partial export"))]
    lines = lines or [line for line in text.splitlines() if line.strip()]  # a traceback's end
    return " ".join(lines[-1].split())[:300] if lines else ""


def _firm(note: str) -> str:
    """'onnxruntime: 600 of eager's 900 detections … 615 firm' → 'onnxruntime 615/900'."""
    backend, rest = note.split(": ", 1)
    eager = rest.split(" of eager's ", 1)[1].split(" ", 1)[0]
    return f"{backend} {rest.rsplit('; ', 1)[-1].removesuffix(' firm')}/{eager}"


def measure(builder: str, root: Path, limit: float) -> str:
    model = f"torchvision:{builder}"
    art = root / builder
    code, export_s, said = _run(
        ["--artifacts-dir", str(art), "export", "--model", model, "--random-init",
         "--format", "torchscript", "--format", "onnx"], root, limit,
    )  # fmt: skip
    if code not in (0, 3):
        return f"| {builder} | export exit {code}: {_last_error(said)} | {export_s:.0f} | | |"
    manifest = json.loads(next(art.glob("*/export/manifest.json")).read_text())
    written = sorted(k for k in manifest["artifacts"] if k in FORMATS)
    written += [f"{key} failed" for key in manifest.get("failed", {})]
    code, verify_s, said = _run(["--artifacts-dir", str(art), "verify", "--model", model],
                                root, limit)  # fmt: skip
    reports = list(art.glob("*/parity.json"))
    if not reports:
        return f"| {builder} | {', '.join(written)}; verify exit {code}: {_last_error(said)} | {export_s:.0f} | {verify_s:.0f} | |"
    rows = json.loads(reports[0].read_text())["rows"]
    passed = sum(r["passed"] for r in rows)
    notes = json.loads(reports[0].read_text()).get("notes", [])
    share = ", ".join(_firm(n) for n in notes if n.endswith(" firm"))
    verdict = "PASS" if code == 0 else f"FAIL (exit {code})"
    return (
        f"| {builder} | {', '.join(written)}; verify {verdict}, {passed}/{len(rows)} checks "
        f"| {export_s:.0f} | {verify_s:.0f} | {share} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builders", nargs="*", help="default: every detection builder")
    parser.add_argument("--limit-s", type=float, default=900.0)
    args = parser.parse_args()
    builders = args.builders or torchvision.models.list_models(module=torchvision.models.detection)
    print("| builder | result | export s | verify s | firm (eager's, per backend) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="detectors-") as tmp:
        for builder in builders:
            print(measure(builder, Path(tmp), args.limit_s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
