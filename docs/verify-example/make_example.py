"""Produce the failing parity report the README's Verify section shows.

What a broken exporter would hand verify: mobilenet_v3_small exported with
--random-init, then one convolution weight of `features.6` in model.onnx
scaled by 1.5 and the manifest's sha256 updated, so that only the numbers can
catch it. `pipeline verify --bisect` then fails, names the layer, writes the
smallest failing ONNX subgraph, and its Markdown report with histograms lands
here. Run it with `make verify-example`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import onnx
from onnx import numpy_helper

from pipeline.cli import main
from pipeline.core.fileio import sha256_file, write_json
from pipeline.core.manifest import MANIFEST_NAME

HERE = Path(__file__).resolve().parent
MODEL = "torchvision:mobilenet_v3_small"


def _alter_onnx(export_dir: Path) -> str:
    path = export_dir / "model.onnx"
    model = onnx.load(str(path))
    init = next(
        i for i in model.graph.initializer if "features.6" in i.name and i.name.endswith("weight")
    )
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(model, str(path))
    manifest = json.loads((export_dir / MANIFEST_NAME).read_text())
    manifest["artifacts"]["onnx"]["sha256"] = sha256_file(path)
    write_json(export_dir / MANIFEST_NAME, manifest)
    return init.name


def main_example() -> int:
    with tempfile.TemporaryDirectory(prefix="verify-example-") as tmp:
        root = Path(tmp)
        args = ["--artifacts-dir", str(root)]
        code = main(
            [
                *args,
                "export",
                "--model",
                MODEL,
                "--random-init",
                "--format",
                "torchscript",
                "--format",
                "onnx",
            ]
        )
        if code != 0:
            return code
        export_dir = root / "torchvision_mobilenet_v3_small" / "export"
        altered = _alter_onnx(export_dir)
        for old in HERE.glob("parity*"):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        out = io.StringIO()
        os.environ["COLUMNS"] = "200"
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(
                [
                    *args,
                    "verify",
                    "--model",
                    MODEL,
                    "--bisect",
                    "--report",
                    str(HERE / "parity.json"),
                ]
            )
        text = (
            out.getvalue().replace(str(root), "artifacts").replace(str(HERE), "docs/verify-example")
        )
        # Keep the output free of this machine's paths.
        text = re.sub(r"/tmp/verify-example-[^/\s]+", "artifacts", text)
        (HERE / "verify-output.txt").write_text(
            f"$ pipeline verify --model {MODEL} --bisect\n{text}exit status {code}\n"
        )
        for name in ("parity.json", "parity.md"):
            p = HERE / name
            p.write_text(p.read_text().replace(str(root), "artifacts").replace(str(HERE) + "/", ""))
        print(text)
        print(f"altered ONNX initializer {altered!r}; verify exited {code}; report in {HERE}")
        return 0 if code == 1 else 1  # the example must fail verify


if __name__ == "__main__":
    sys.exit(main_example())
