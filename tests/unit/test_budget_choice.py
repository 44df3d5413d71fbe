"""Choosing what to serve within the accuracy budget (bench.fastest, serving.served)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.bench.fastest import fastest_of
from pipeline.core import paths
from pipeline.serving.provenance import ServedInfo
from pipeline.serving.served import choice_lines, choose, quality_holds, within_budget
from pipeline.serving.server import Server
from pipeline_runtime.manifest import ArtifactRecord, Manifest
from tests.manifests import digits_manifest


def _quality(value: float, bound: float = 0.5, rule: str = "accuracy") -> dict[str, Any]:
    held = value >= bound if rule == "sqnr" else value <= bound
    check = {"rule": rule, "metric": "accuracy drop", "value": value, "bound": bound,
             "unit": "pts", "kind": "pass" if held else "tolerance"}  # fmt: skip
    return {"within_budget": held, "checks": [check]}


def _manifest(**quality: dict[str, Any]) -> Manifest:
    artifacts = {"torchscript": ArtifactRecord("model.torchscript.pt", "torchscript", "a")}
    for key, q in quality.items():
        artifacts[key] = ArtifactRecord(
            f"{key}.onnx", key, "b", details={"precision": "int8", "quality": q}
        )
    return digits_manifest(artifacts, checkpoint_sha="c")


def _cell(backend: str, fmt: str, ms: float, verified: bool = True) -> dict[str, Any]:
    return {"backend": backend, "format": fmt, "median_ms": ms, "batch": 1, "verified": verified}


CELLS = [
    _cell("onnxruntime_int8_dynamic", "onnx_int8_dynamic", 0.02),
    _cell("onnxruntime_int8_static", "onnx_int8_static", 0.03),
    _cell("torchscript", "torchscript", 0.10),
    _cell("onnxruntime_fp16", "onnx_fp16", 0.01, verified=False),  # fastest, but failed verify
]


def test_bench_names_the_fastest_verified_and_what_it_left_out() -> None:
    entry = fastest_of(CELLS)
    assert entry is not None and entry["format"] == "onnx_int8_dynamic"
    assert [c["format"] for c in entry["candidates"]] == [
        "onnx_int8_dynamic", "onnx_int8_static", "torchscript"
    ]  # fmt: skip
    assert entry["excluded"][0]["format"] == "onnx_fp16"
    assert (
        "within the accuracy budget" in entry["why"]
        and "left out: onnxruntime_fp16" in entry["why"]
    )


def test_serving_never_picks_a_format_outside_the_budget() -> None:
    fastest = fastest_of(CELLS)
    manifest = _manifest(onnx_int8_dynamic=_quality(1.2), onnx_int8_static=_quality(0.3))
    chosen = within_budget(fastest, manifest)
    assert chosen is not None and chosen["format"] == "onnx_int8_static"
    assert (
        "passed over: onnxruntime_int8_dynamic (onnx_int8_dynamic): int8, OUTSIDE" in chosen["why"]
    )
    fmt, why = choose(manifest, fastest)
    assert fmt == "onnx_int8_static" and why == chosen["why"]


def test_a_stricter_budget_given_at_archive_or_serve_time_is_applied() -> None:
    fastest = fastest_of(CELLS)
    manifest = _manifest(onnx_int8_dynamic=_quality(0.3), onnx_int8_static=_quality(0.3))
    assert within_budget(fastest, manifest)["format"] == "onnx_int8_dynamic"  # type: ignore[index]
    # With a 0.1-point budget neither int8 artifact qualifies: the float32 reference is served.
    chosen = within_budget(fastest, manifest, accuracy_budget=0.1)
    assert chosen is not None and chosen["format"] == "torchscript"
    assert quality_holds(manifest.artifacts["onnx_int8_static"], 0.1)[0] is False


def test_no_bench_result_or_nothing_within_budget_falls_back_to_the_registry_order() -> None:
    manifest = _manifest(onnx_int8_static=_quality(2.0))
    assert choose(manifest, None) == (
        "torchscript",
        "no bench result to choose by: the first format held in registry order "
        "(torchscript, float32)",
    )
    only_int8 = fastest_of([_cell("onnxruntime_int8_static", "onnx_int8_static", 0.03)])
    fmt, why = choose(manifest, only_int8)
    assert fmt == "torchscript" and "none of bench's verified backends" in why


def test_an_artifact_never_judged_is_not_within_any_budget() -> None:
    record = ArtifactRecord("m.onnx", "onnx_int8_static", "s", details={"precision": "int8"})
    held, words = quality_holds(record)
    assert not held and "never judged" in words


def test_serve_prints_which_format_each_model_is_served_in_and_why(tmp_path: Path) -> None:
    manifest = _manifest(onnx_int8_static=_quality(0.3))
    export_dir = paths.export_dir("digits_lenet", tmp_path)
    export_dir.mkdir(parents=True)
    (export_dir / "manifest.json").write_text(manifest.dumps())
    fastest = fastest_of(CELLS[1:3])  # int8 static (0.03 ms) before TorchScript
    name = "digits_lenet_onnx_int8s"
    server = Server(
        runtime="torchserve",
        pid=1,
        run_dir=str(tmp_path),
        inference_url="http://127.0.0.1:1",
        metrics_url="",
        models=[name],
        served={name: ServedInfo.of(manifest, "onnx_int8_static", fastest)},
    )
    (line,) = choice_lines(server, tmp_path)
    assert line.startswith(
        f"digits_lenet: serving onnx_int8_static (int8) as {name}: onnxruntime_int8_static "
        "(onnx_int8_static, int8) is the fastest at batch 1 (0.030 ms median)"
    )
    assert "within the accuracy budget" in line


def test_partial_message_names_what_was_kept_or_that_nothing_was(tmp_path: Path) -> None:
    from pipeline.export.partial import partial_message
    from pipeline.export.writing import outside_budget

    check = {"passed": False, "rule": "sqnr", "metric": "SQNR", "value": 47.65119495595491,
             "unit": "dB", "bound": 200.0, "on": "golden+probe+random"}  # fmt: skip
    why = outside_budget({"checks": [check]})
    assert "SQNR 47.65 dB against a bound of 200.00 dB" in why
    assert why.endswith("verify fails it and archive/serve never choose it")
    # An on-device format is never served: nothing to say of archive and serve.
    assert outside_budget({"checks": [check]}, served=False).endswith("verify fails it")
    # Only the int8 format was asked for, and it came out outside its budget.
    both = _manifest(onnx_int8_static={})
    only = dataclasses.replace(
        both,
        artifacts={"onnx_int8_static": both.artifacts["onnx_int8_static"]},
        failed={"onnx_int8_static": why},
    )
    said = partial_message(only, tmp_path)
    assert f"No format requested was written and checked in {tmp_path}." in said
    assert ": ." not in said
    kept = dataclasses.replace(only, artifacts=both.artifacts)
    assert f"Written and checked in {tmp_path}: model.torchscript.pt (torchscript)." in (
        partial_message(kept, tmp_path)
    )
    # A float16 graph ONNX Runtime's CPU provider crashed on (the tagger's LSTM) was
    # listed as "Written and checked"; it is written for GPU providers, unchecked here.
    fp16 = ArtifactRecord("model.fp16.onnx", "onnx_fp16", "d", details={"cpu_runs": False})
    said = partial_message(
        dataclasses.replace(kept, artifacts={**both.artifacts, "onnx_fp16": fp16}), tmp_path
    )
    assert f"Written and checked in {tmp_path}: model.torchscript.pt (torchscript). " in said
    assert "Written unchecked (ONNX Runtime's CPU provider cannot run it; verify it where a " \
           "GPU provider does): model.fp16.onnx (onnx_fp16)." in said  # fmt: skip
