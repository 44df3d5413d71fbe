"""The parity table shows which bound decided each check and the margin (issue 20, point 8).

A pass with max rel err above rtol (atol covered it) must read as a pass with
room left, not as a near-failure; a failure must say how far over it went; a
vacuous tolerance must never show a margin.
"""

import io
import json
from pathlib import Path

import torch
from rich.console import Console

from pipeline.core.compare import Comparison, Kind, compare_tensor
from pipeline.verify.page import series, write_page
from pipeline.verify.report import BOUND_HEADER, ParityReport, Row

ATOL, RTOL = 1e-5, 1e-4
# float64, so that the errors below are what the cells print.
REF = torch.tensor([0.031, 0.5, -1.2, 200.0], dtype=torch.float64)


def _row(got: torch.Tensor, inputs: str = "golden", *, allow_vacuous: bool = False) -> Row:
    return _row_of(REF, got, inputs, allow_vacuous=allow_vacuous)


def _row_of(ref: torch.Tensor, got: torch.Tensor, inputs: str, *, allow_vacuous: bool) -> Row:
    c = compare_tensor(ref, got, ATOL, RTOL, strict=True, allow_vacuous=allow_vacuous)
    return Row.of("onnxruntime", inputs, "logits", c, ATOL, RTOL)


def _off(i: int, err: float) -> torch.Tensor:
    got = REF.clone()
    got[i] += err
    return got


def _table(rows: list[Row]) -> list[str]:
    """The terminal table's lines."""
    console = Console(width=250, record=True, file=io.StringIO())
    ParityReport("m", "/x", "now", {"atol": ATOL, "rtol": RTOL}, {}, rows).print_table(console)
    return console.export_text().splitlines()


def _line(lines: list[str], inputs: str) -> str:
    return next(line for line in lines if f"│ {inputs} " in line)


def test_a_pass_decided_by_atol_shows_atol_and_the_room_left_though_rel_err_is_over_rtol() -> None:
    # The case: |err| / |ref| = 2.6e-4 > rtol, but atol covers it.
    row = _row(_off(0, 8e-6), "atol case")
    assert row.passed and row.max_rel > RTOL
    assert row.bound_cells() == ("8.0e-06 ≤ 1e-05 + 1e-04·3.1e-02 = 1.3e-05", "atol", "38% left")
    line = _line(_table([row]), "atol case")
    assert "8.0e-06 ≤ 1e-05 + 1e-04·3.1e-02 = 1.3e-05 │ atol " in line
    assert "38% left" in line and "✓ pass" in line
    assert row.to_json()["bound_term"] == "atol"


def test_a_pass_decided_by_rtol_shows_the_relative_term() -> None:
    row = _row(_off(3, 1.5e-2), "rtol case")
    assert row.passed
    bound, term, margin = row.bound_cells()
    assert (bound, term, margin) == (
        "1.5e-02 ≤ 1e-05 + 1e-04·2.0e+02 = 2.0e-02",
        "rtol·|ref|",
        "25% left",
    )
    cells = [c.strip() for c in _line(_table([row]), "rtol case").split("│")]
    assert cells[cells.index(bound) :][:3] == [bound, term, margin]
    assert row.to_json()["bound_term"] == "rtol"


def test_a_failure_shows_the_bound_it_broke_and_how_many_times_over() -> None:
    row = _row(_off(2, 1e-3), "failing")
    assert row.kind is Kind.TOLERANCE
    # 1e-3 / (1e-5 + 1e-4 * 1.2) = 7.7
    assert row.bound_cells() == (
        "1.0e-03 > 1e-05 + 1e-04·1.2e+00 = 1.3e-04",
        "rtol·|ref|",
        "7.7× over",
    )
    line = _line(_table([row]), "failing")
    assert "7.7× over" in line and "✗ tolerance" in line and "left" not in line


def test_exact_equality_says_exact_and_names_no_term() -> None:
    row = _row(REF.clone(), "same")
    assert row.bound_cells() == ("|err| = 0 everywhere", "—", "exact")
    assert row.to_json()["bound_term"] is None
    assert "exact" in _line(_table([row]), "same")


def test_the_deciding_element_is_the_one_nearest_its_bound_not_the_largest_error() -> None:
    # 1e-3 at |ref| 200 uses 5% of its allowance; 9e-6 at |ref| 0.031 uses 69% of its own.
    got = REF.clone()
    got[3] += 1e-3
    got[0] += 9e-6
    row = _row(got)
    assert row.max_abs > 1e-4
    assert row.bound_cells()[0].startswith("9.0e-06 ≤")
    assert row.bound_cells()[1:] == ("atol", "31% left")


def test_a_vacuous_tolerance_never_shows_a_margin_whether_refused_or_accepted() -> None:
    tiny = REF * 1e-9
    zeros = torch.zeros_like(tiny)
    refused = _row_of(tiny, zeros, "refused", allow_vacuous=False)
    accepted = _row_of(tiny, zeros, "accepted", allow_vacuous=True)
    assert refused.kind is Kind.VACUOUS and accepted.passed
    for row in (refused, accepted):
        assert row.bound_cells()[2] == "vacuous"
    lines = _table([refused, accepted])
    assert "left" not in _line(lines, "refused") + _line(lines, "accepted")
    # An exact answer under a vacuous tolerance is no margin either.
    assert _row_of(tiny, tiny.clone(), "x", allow_vacuous=True).bound_cells()[2] == "vacuous"
    # But a failure under such a tolerance still says how far over it went.
    over = _row_of(tiny, tiny + 1.0, "x", allow_vacuous=True)
    assert over.kind is Kind.TOLERANCE and over.bound_cells()[2].endswith("× over")


def test_rows_that_never_reached_the_bound_still_render() -> None:
    rows = [
        Row.missing("torchscript", "golden", "logits", ATOL, RTOL),
        Row.crashed("pt2", "crashing", "logits", RuntimeError("boom"), ATOL, RTOL),
        Row.of("cpp", "shape", "logits", Comparison.failed(Kind.SHAPE, "shape (2,) != (3,)"), 1, 1),
    ]
    for row in rows:
        assert row.bound_cells() == ("—", "—", "—") and row.to_json()["bound_term"] is None
    lines = _table(rows)
    assert "✗ missing output" in _line(lines, "golden") and "✗ crashed" in _line(lines, "crashing")


def test_the_table_drops_max_rel_and_explains_the_bound() -> None:
    text = "\n".join(_table([_row(_off(0, 8e-6))]))
    assert BOUND_HEADER in text and "decided by" in text and "margin" in text
    assert "max rel" not in text
    assert "allclose's rule" in text


def test_parity_json_keeps_every_old_field_and_adds_the_bound() -> None:
    row = _row(_off(0, 8e-6))
    out = json.loads(json.dumps(row.to_json()))
    old = {"backend", "inputs", "output", "atol", "rtol", "max_abs", "max_rel", "passed", "kind"}
    assert old <= out.keys()
    assert out["bound_term"] == "atol" and out["vacuous"] is False
    assert abs(out["bound_err"] - 8e-6) < 1e-12 and abs(out["bound_ref"] - 0.031) < 1e-12
    assert abs(out["bound_allowed"] - (ATOL + RTOL * 0.031)) < 1e-15
    assert 0.6 < out["bound_used"] < 0.62
    # A crashed check has no element: null, not a zero that reads as exact.
    crashed = Row.crashed("b", "i", "o", RuntimeError("x"), ATOL, RTOL).to_json()
    assert crashed["bound_used"] is None and crashed["max_abs"] == "inf"


def test_the_page_shows_the_bound_in_both_tables_and_the_worst_input_set(tmp_path: Path) -> None:
    rows = [_row(_off(0, 8e-6), "atol case"), _row(_off(2, 1e-3), "failing"), _row(REF, "same")]
    report = ParityReport("m", "/x", "now", {"atol": ATOL, "rtol": RTOL}, {}, rows)
    assert series(report)[0].deciding.inputs == "failing"  # the failure speaks for the series
    text = write_page(report, tmp_path / "parity.md").read_text()
    header = "\\|err\\| ≤ atol + rtol·\\|ref\\| | decided by | margin"
    assert text.count(header) == 2
    summary = next(line for line in text.splitlines() if line.startswith("| onnxruntime | logits"))
    assert (
        "| 1.0e-03 > 1e-05 + 1e-04·1.2e+00 = 1.3e-04 | rtol·\\|ref\\| | **7.7× over** |" in summary
    )
    every = next(line for line in text.splitlines() if "| atol case |" in line)
    assert "| 8.0e-06 ≤ 1e-05 + 1e-04·3.1e-02 = 1.3e-05 | atol | 38% left |" in every
    headers = [line for line in text.splitlines() if line.startswith("| backend |")]
    assert len(headers) == 2 and not any("max rel" in h for h in headers)


def test_a_detection_rows_cells_are_the_rules_bounds_not_zeros(tmp_path: Path) -> None:
    """A detection rule's row showed 0.0e+00 for p99 abs, max|ref|, min atol and min rtol,
    statistics it does not have, and a blank bound (ONNX) or "exact" (TorchScript, whose
    box errors were 0 while its scores were not): a user's trial, 2026-11-28."""
    from pipeline.core import detections as detect
    from pipeline.verify.report import DETECTIONS

    onnx = Row.of("onnxruntime", "golden", DETECTIONS, Comparison(0.01, 2e-5, True), 0.04, 0.0)
    ts = Row.of("torchscript", "golden", DETECTIONS, Comparison(0.0, 0.0, True), 0.04, 0.0)
    bound, term, margin = onnx.bound_cells()
    assert bound == f"box 1.0e-02 ≤ {detect.BOX_ATOL:g} px, score 2.0e-05 ≤ {detect.SCORE_ATOL:g}"
    assert (term, margin) == ("detection rule", "75% left")  # box 0.01 of 0.04 px: the tighter
    assert ts.bound_cells()[2] == "exact" and not onnx.statistics
    line = _line(_table([onnx]), "golden")
    assert "0.0e+00" not in line, line
    write_page(ParityReport("m", "/x", "now", {"atol": ATOL, "rtol": RTOL}, {}, [onnx, ts]),
               tmp_path / "parity.md")  # fmt: skip
    page = (tmp_path / "parity.md").read_text()
    assert "| detection rule | 75% left |  |  |  |  |  | pass |" in page, page  # no statistics
    assert not list((tmp_path / "parity_files").glob("*.png"))  # no |error| histogram


def test_a_detectors_table_quotes_the_detection_rule_not_atol_and_rtol() -> None:
    # Its footer said "tolerance: atol 1e-05, rtol 0.0001", bounds no detection row is
    # held to (a user's detector trial); the rule is in the notes.
    from pipeline.verify.report import DETECTIONS

    crashed = Row.crashed("kserve/onnx", "golden", DETECTIONS, RuntimeError("x"), ATOL, RTOL)
    lines = _table([crashed])
    assert any("tolerance: the detection rule's, in the notes below" in ln for ln in lines)
    assert not any("tolerance: atol" in ln for ln in lines)
    assert any("tolerance: atol" in ln for ln in _table([_row(torch.zeros(3))]))
