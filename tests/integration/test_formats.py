"""Every registered format, end to end: export → load → verify → archive → handler → served answer.

The tests walk the registry (`pipeline.formats.base`), so a new format gets
this coverage by registering: nothing here names a format. What a format is
held to comes from its declared precision: float32 formats match eager
elementwise; int8/float16 ones keep to the accuracy budget export recorded
(pipeline/export/quality.py), and a server answers with what the artifact itself
computes in-process. The float32 formats come from the session's `exported`
digits CNN, the others from `precision_exported` (same checkpoint).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.core.budget import Budget
from pipeline.export import ExportResult
from pipeline.export.opened import open_export
from pipeline.export.quality import judge
from pipeline.formats import base as registry
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive, archive_name
from pipeline.runtimes.torchserve.launch import ServeConfig, Server, free_port, start, stop
from pipeline.serving import loadtest
from pipeline.serving.client import post, tensors_body
from pipeline.serving.loadtest import LoadConfig
from pipeline.verify import VerifyConfig, verify
from pipeline.verify.backends import cpp_backend_name
from tests.integration.conftest import DETECTOR_BATCHES, RECURRENT

FORMATS = [f.key for f in registry.all_formats()]
# What a server runs: every format but the on-device ones (test_pte.py proves those refused).
SERVED = [f.key for f in registry.all_formats() if f.served]
MODEL = "digits_lenet"


def _float32(key: str) -> bool:
    return registry.get(key).precision == registry.FLOAT32


@pytest.fixture(scope="module")
def by_format(exported: ExportResult, precision_exported: ExportResult) -> dict[str, ExportResult]:
    """Each registered format → the session export holding it."""
    out: dict[str, ExportResult] = {}
    for result in (exported, precision_exported):
        for key in result.manifest.artifacts:
            out.setdefault(key, result)
    return out


@pytest.fixture(scope="module")
def store(
    by_format: dict[str, ExportResult],
    recurrent: dict[str, dict[str, Any]],
    detector: dict[str, Any],
    two_stage: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """One archive per registered format, through the registry's own archive suffix/handler;
    the recurrent models' .pt2 (the format with the scan formulation inside); and the
    detectors' TorchScript and ONNX (per-sample outputs)."""
    store = tmp_path_factory.mktemp("formats_store")
    for result in {id(r): r for r in by_format.values()}.values():
        archive(ArchiveConfig(model=MODEL, export_dir=result.out_dir, store=store, formats=None))
    for made in recurrent.values():
        folder = Path(made["export_dir"])
        archive(
            ArchiveConfig(model=made["model"], export_dir=folder, store=store, formats=("pt2",))
        )
    for made in (detector, two_stage):
        folder = Path(made["export_dir"])
        archive(ArchiveConfig(model=made["model"], export_dir=folder, store=store, formats=None))
    return store


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("formats_run")
    srv = start(
        ServeConfig(
            store=store,
            run_dir=run_dir,
            inference_port=free_port(),
            management_port=free_port(),
            metrics_port=free_port(),
            workers_per_model=1,
            threads_per_worker=1,
            startup_timeout_s=420,
            # The detector's 320×320 images as JSON are about 6 MB each.
            max_request_size=64 * 2**20,
        )
    )
    try:
        yield srv
    finally:
        stop(run_dir)


def test_the_registry_is_consistent() -> None:
    from pipeline_runtime import formats

    seen: dict[str, set] = {"key": set(), "file": set(), "served_suffix": set(), "backend": set()}
    for fmt in registry.all_formats():
        for attr, values in seen.items():
            assert getattr(fmt, attr) not in values, f"{fmt.key} repeats {attr}"
            values.add(getattr(fmt, attr))
        # what serving processes know of it: the descriptor they ship, the same
        assert formats.of(fmt.key) == fmt.descriptor and fmt.runner in formats.RUNNERS
        assert registry.get(fmt.key) is fmt
        assert registry.by_backend(fmt.backend) is fmt
        assert registry.by_suffix(fmt.served_suffix) is fmt
    with pytest.raises(ValueError, match="reuses"):
        registry.register(registry.all_formats()[0])


@pytest.mark.parametrize("key", FORMATS)
def test_export_holds_the_format_and_its_runner_matches_eager(
    by_format: dict[str, ExportResult], key: str
) -> None:
    fmt = registry.get(key)
    exported = by_format[key]
    record = exported.manifest.artifact(key)
    assert record.file == fmt.file and record.format == key
    assert record.get("precision") == fmt.precision
    assert record.get("size_bytes") == (exported.out_dir / record.file).stat().st_size
    opened = open_export(exported.out_dir)
    runner = opened.load(key)
    inputs, stored = opened.golden()
    got = runner(inputs)
    assert list(got) == opened.manifest.output_names
    if _float32(key):
        for name, value in got.items():
            torch.testing.assert_close(value, stored[name], atol=1e-4, rtol=1e-3)
        return
    # Reduced precision: within the budget export recorded, re-measured here, and the
    # verdict export wrote says the same.
    verdicts = judge(
        opened.entry,
        bool(opened.manifest.serving.topk),
        opened.eager,
        runner,
        [("golden", inputs)],
        opened.manifest.output_names,
        fmt.precision,
        Budget.from_json(record.get("budget")),
        record=record,  # its batches: an ExecuTorch program's planned batch at most
    )
    assert verdicts and all(v.passed for v in verdicts), [v.describe() for v in verdicts]
    assert record.get("quality")["within_budget"] is True
    assert record.get("quality")["checks"] == [v.to_json() for v in verdicts]


@pytest.mark.parametrize("key", FORMATS)
def test_verify_passes_for_the_format(
    by_format: dict[str, ExportResult], key: str, tmp_path: Path
) -> None:
    backend = registry.get(key).backend
    report = verify(
        VerifyConfig(
            model=MODEL,
            export_dir=by_format[key].out_dir,
            backends=(backend,),
            report=tmp_path / "parity.json",
        )
    )
    assert report.passed, report.failure_message()
    assert {r.backend for r in report.rows} == {"golden file", backend}
    task_level = [r for r in report.rows if r.task is not None]
    assert bool(task_level) is not _float32(key)


@pytest.mark.parametrize("key", SERVED)
def test_archive_carries_the_handler_and_the_runtime(store: Path, key: str) -> None:
    fmt = registry.get(key)
    mar = store / f"{archive_name(MODEL, key)}.mar"
    assert mar.name.endswith(f"_{fmt.served_suffix}.mar")
    with zipfile.ZipFile(mar) as zf:
        names = set(zf.namelist())
        handler = zf.read(f"{key}_handler.py").decode()  # written by archive, from the key
    assert {fmt.file, "manifest.json", "golden.pt"} <= names
    assert f"format_key = {key!r}" in handler and "from pipeline." not in handler
    assert "pipeline_runtime/runners.py" in names


@pytest.mark.parametrize("key", SERVED)
def test_served_answer_matches_eager(
    by_format: dict[str, ExportResult], server: Server, key: str
) -> None:
    opened = open_export(by_format[key].out_dir)
    inputs = opened.sample(batch=3, seed=7)
    # float32: eager's answer; int8/float16: what the artifact computes in-process.
    expected = opened.eager(inputs) if _float32(key) else opened.load(key)(inputs)
    resp = post(server, archive_name(MODEL, key), tensors_body(inputs))
    assert resp.status_code == 200, resp.text
    outputs = resp.json()["outputs"]
    assert list(outputs) == opened.manifest.output_names
    for name, value in outputs.items():
        torch.testing.assert_close(torch.tensor(value), expected[name], atol=1e-4, rtol=1e-3)


# --- recurrent models: nn.LSTM and nn.GRU with a dynamic sequence axis (issue 30) -------


def _example_length(opened: Any) -> int:
    inputs, _ = opened.golden()
    return int(next(iter(inputs.values())).shape[1])  # (batch, seq, ...)


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_models_export_every_format_and_verify_at_three_lengths(
    recurrent: dict[str, dict[str, Any]], binary: Path, name: str, tmp_path: Path
) -> None:
    """Every served float32 format exports (exit 0), and it, and the C++ client on those it
    runs, equals eager at sequence length 1, the example's and 3× the example's."""
    made = recurrent[name]
    assert made["returncode"] == 0, made["stderr"]
    layer = "nn.LSTM" if "lstm" in name else "nn.GRU"
    assert (
        f"torch.export ({layer} → scan formulation): rnn: {layer} → scan formulation"
        in (made["stdout"])
    )
    opened = open_export(Path(made["export_dir"]))
    float32 = [k for k in SERVED if _float32(k)]
    assert sorted(k for k in opened.manifest.artifacts if k in FORMATS) == sorted(float32)
    pt2 = opened.manifest.artifact("pt2")
    assert [(r["module"], r["replaced"]) for r in pt2.get("recurrent")] == [("rnn", True)]
    assert pt2.get("fixed_axes") is None
    report = verify(
        VerifyConfig(
            model=made["model"],
            export_dir=Path(made["export_dir"]),
            with_cpp=True,
            cpp_binary=binary,
            report=tmp_path / "parity.json",
        )
    )
    assert report.passed, report.failure_message()
    example = _example_length(opened)
    lengths = {"random seq=1", "golden", f"random seq={3 * example}"}
    wanted = {registry.get(k).backend for k in float32}
    wanted |= {cpp_backend_name(registry.get(k)) for k in float32 if registry.get(k).cpp}
    backends = {r.backend for r in report.rows} - {"golden file"}
    assert wanted <= backends, backends
    for backend in backends:
        assert lengths <= {r.inputs for r in report.rows if r.backend == backend}, backend


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_served_recurrent_pt2_answers_at_other_sequence_lengths(
    recurrent: dict[str, dict[str, Any]], server: Server, name: str
) -> None:
    made = recurrent[name]
    opened = open_export(Path(made["export_dir"]))
    example = _example_length(opened)
    for length in (1, 3 * example):
        generator = torch.Generator().manual_seed(length)
        inputs = opened.entry.sample_inputs(opened.entry.sizes(batch=2, seq=length), generator)
        expected = opened.eager(inputs)
        resp = post(server, archive_name(made["model"], "pt2"), tensors_body(inputs))
        assert resp.status_code == 200, resp.text
        for key, value in resp.json()["outputs"].items():
            torch.testing.assert_close(torch.tensor(value), expected[key], atol=1e-4, rtol=1e-3)


def test_a_token_past_the_vocabulary_is_a_400_and_the_compiled_worker_lives(
    recurrent: dict[str, dict[str, Any]], server: Server
) -> None:
    """The tagger's vocabulary is declared (`--input tokens:int64:batch,seq:0:1000`). A
    token id of 5000 aborted the .pt2 worker ("index out of bounds: 0 <= tmp2 < 1000"
    in the compiled kernel); the gateway then resent it to the next worker."""
    made = recurrent["lstm_tagger"]
    name = archive_name(made["model"], "pt2")
    opened = open_export(Path(made["export_dir"]))
    inputs = opened.entry.sample_inputs(opened.entry.sizes(batch=1), torch.Generator())
    bad = {"tokens": inputs["tokens"].clone()}
    bad["tokens"][0, 0] = 5000
    resp = post(server, name, tensors_body(bad))
    assert resp.status_code == 400, resp.text
    assert "holds 5000; its values must be in 0..999" in resp.json()["error"], resp.text
    resp = post(server, name, tensors_body(inputs))
    assert resp.status_code == 200, resp.text
    for key, value in resp.json()["outputs"].items():
        torch.testing.assert_close(
            torch.tensor(value), opened.eager(inputs)[key], atol=1e-4, rtol=1e-3
        )


# --- a detector: per-sample outputs (issue 36) ---------------------------------------------


@pytest.mark.parametrize("made", ["detector", "two_stage"])
def test_served_detections_pass_the_detection_rule(
    made: str, server: Server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """TorchServe answers each detector's boxes, scores, labels and counts (TorchScript at
    any batch, ONNX at its traced batch of 1, other sizes refused with a 400), and verify
    holds the served answers to the detection rule."""
    from pipeline.serving.backends import served_backends

    detector = request.getfixturevalue(made)

    export_dir = Path(detector["export_dir"])
    opened = open_export(export_dir)
    served = served_backends(detector["model"], opened.manifest, server)
    assert {b.format_key for b in served} == {"torchscript", "onnx"}
    config = VerifyConfig(
        model=detector["model"],
        export_dir=export_dir,
        backends=("torchserve",),
        report=tmp_path / "parity.json",
        page=False,
        batch_sizes=DETECTOR_BATCHES,
    )
    report = verify(config, served=served)
    assert report.passed, report.failure_message()
    rows = [r for r in report.rows if r.backend.startswith("torchserve/")]
    assert {r.backend for r in rows} == {"torchserve/torchscript", "torchserve/onnx"}
    assert {r.output for r in rows} == {"detections"}
    two = opened.sample(2)
    refused = post(server, archive_name(detector["model"], "onnx"), tensors_body(two))
    assert refused.status_code == 400 and "[1, 3, 320, 320]" in refused.text, refused.text
    answer = post(server, archive_name(detector["model"], "torchscript"), tensors_body(two))
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["outputs"]
    assert set(outputs) == {"boxes", "scores", "labels", "counts"}
    assert len(outputs["counts"]) == 2 and sum(outputs["counts"]) == len(outputs["scores"])


def test_loadtest_holds_a_reduced_format_to_its_task_level_bound(
    by_format: dict[str, ExportResult], server: Server
) -> None:
    """`bench` then `serve` serves the digits CNN as dynamic int8; `loadtest` failed every
    answer of it (held to float32's tolerance, while stacked requests even change its
    activation scales). Its answers are pooled and held to the SQNR export recorded."""
    key = "onnx_int8_dynamic"
    report = loadtest.run(
        LoadConfig(
            export_dir=by_format[key].out_dir,
            served=archive_name(MODEL, key),
            run_dir=Path(server.run_dir),
            requests=160,
            concurrency=8,
        )
    )
    said = report.summary()
    assert report.passed and report.wrong == 0 and report.answered == 160, said
    assert [v["rule"] for v in report.judged] == ["sqnr"], said
    assert report.judged[0]["samples"] == 160 * 10  # every answer's ten logits, pooled
    assert f"{key} (int8): answers held to the task-level SQNR" in said
