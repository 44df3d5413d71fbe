"""A format registered from tests/ alone (issue 50): a descriptor and an export function,
and nothing under pipeline/ or handlers/ changes. Export writes it, verify checks it in
process, and both runtimes serve it: TorchServe from an archive whose handler `pipeline
archive` wrote, the KServe runtime torch-free. Neither server's processes ever import
this module: they know the format from the descriptor its manifest record carries.

The format is what a user who wants ONNX at the exporter's default opset (20, where the
project picks 18) would register: the same exporter, another opset, another file."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from torch import nn

from pipeline.core.fileio import sha256_file
from pipeline.export import ExportConfig, export
from pipeline.formats import base as registry
from pipeline.runtimes.kserve.launch import private, served_export
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive, archive_name
from pipeline.runtimes.torchserve.launch import private_config, start
from pipeline.serving import runtime
from pipeline.serving.backends import served_backends
from pipeline.serving.client import auth_headers
from pipeline.serving.launcher import stop
from pipeline.verify import VerifyConfig, verify
from pipeline_runtime import formats
from pipeline_runtime.manifest import ArtifactRecord

KEY, FILE, OPSET = "onnx_opset20", "model.opset20.onnx", 20
MODEL = "digits_lenet"


def _export_opset20(model: nn.Module, ctx: registry.ExportContext) -> ArtifactRecord:
    """The project's ONNX exporter (torch.export, its fallbacks and checks) at opset 20."""
    from pipeline.formats.onnx import to_onnx
    from pipeline.formats.torchscript import scripted

    def ts() -> tuple:
        made = scripted(model, ctx)
        return made.module, made.method

    path = ctx.out_dir / FILE
    result = to_onnx(model, ts, ctx.golden, ctx.entry, path, ctx.output_shapes, OPSET)
    details = {"exporter": result.exporter, "opset": OPSET}
    return ArtifactRecord(FILE, KEY, sha256_file(path), reason=result.reason, details=details)


FORMAT = registry.Format(
    key=KEY,
    title="ONNX (opset 20)",
    file=FILE,
    served_suffix="onnx20",
    runner=formats.ONNXRUNTIME,
    backend="onnxruntime_opset20",
    platform="onnxruntime_onnx",
    export=_export_opset20,
    default=False,
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The format registered for this module, and the digits CNN exported in it alone
    (seeded random weights: the format, not the training, is under test)."""
    registry.register(FORMAT)
    try:
        root = tmp_path_factory.mktemp("new_format")
        made = export(
            ExportConfig(
                model=MODEL,
                random_init=True,
                checkpoint=root / "checkpoint.pt",
                out_dir=root / "export",
                formats=(KEY,),
            )
        )
        yield made.out_dir
    finally:
        registry.unregister(KEY)


def test_export_writes_it_with_its_descriptor_and_verify_checks_it(
    exported: Path, tmp_path: Path
) -> None:
    record = json.loads((exported / "manifest.json").read_text())["artifacts"][KEY]
    assert record["file"] == FILE and record["opset"] == OPSET
    assert record[formats.RECORD_KEY] == FORMAT.descriptor.to_json()
    report = verify(VerifyConfig(model=MODEL, export_dir=exported, report=tmp_path / "p.json"))
    assert report.passed, report.failure_message()
    assert "onnxruntime_opset20" in {r.backend for r in report.rows}


def test_torchserve_serves_it_from_a_handler_archive_wrote(exported: Path, tmp_path: Path) -> None:
    store, run_dir = tmp_path / "store", tmp_path / "run"
    (mar,) = archive(ArchiveConfig(model=MODEL, export_dir=exported, store=store))
    assert mar.name == f"{archive_name(MODEL, KEY)}.mar"
    with zipfile.ZipFile(mar) as packed:
        handler = packed.read(f"{KEY}_handler.py").decode()
    assert f"format_key = {KEY!r}" in handler
    server = start(private_config(store, run_dir, workers_per_model=1, threads_per_worker=1))
    try:
        served = served_backends(MODEL, _manifest(exported), server, exported)
        assert [b.name for b in served] == [f"torchserve/{KEY}"]
        report = verify(
            VerifyConfig(model=MODEL, export_dir=exported, backends=("torchserve",),
                         report=tmp_path / "p.json", page=False),
            served=served,
        )  # fmt: skip
        assert report.passed, report.failure_message()
        assert {r.backend for r in report.rows} >= {f"torchserve/{KEY}"}
    finally:
        stop(run_dir)


def test_the_kserve_runtime_serves_it_torch_free(exported: Path, tmp_path: Path) -> None:
    with private([served_export(exported, KEY, name="digits")], workers=1) as server:
        served = served_backends(MODEL, _manifest(exported), server, exported)
        assert [b.name for b in served] == [f"kserve/rest/{KEY}", f"kserve/grpc/{KEY}"]
        report = verify(
            VerifyConfig(model=MODEL, export_dir=exported, backends=("kserve",),
                         report=tmp_path / "p.json", page=False),
            served=served,
        )  # fmt: skip
        assert report.passed, report.failure_message()
        meta = httpx.get(
            f"{server.inference_url}/v2/models/digits",
            headers=auth_headers(server, "inference"),
            timeout=10,
        ).json()
        assert meta["platform"] == "onnxruntime_onnx", meta
        # Its descriptor's runner is ONNX Runtime: the worker never loaded libtorch.
        pids = runtime.get("kserve").worker_pids(server, "digits")
        assert pids and all("libtorch" not in Path(f"/proc/{p}/maps").read_text() for p in pids)


def _manifest(export_dir: Path):
    from pipeline.core.manifest import read_manifest

    return read_manifest(export_dir)
