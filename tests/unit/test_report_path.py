"""Where verify writes its report: `verify --export-dir X` wrote <artifacts>/<model>/parity.json,
over the report of the model's own export that publish reads (a user's trial); a report of
another folder goes beside it now, and publish looks there for that folder's."""

from __future__ import annotations

from pathlib import Path

from pipeline.cli import build_parser
from pipeline.core import paths
from pipeline.verify import VerifyConfig


def test_a_report_of_another_export_folder_goes_beside_it(tmp_path: Path) -> None:
    art = tmp_path / "art"
    own = art / "digits_lenet" / "parity.json"
    assert paths.report_path("digits_lenet", art) == own
    assert paths.report_path("digits_lenet", art, art / "digits_lenet" / "export") == own
    other = tmp_path / "exports" / "lenet-v2"
    assert paths.report_path("digits_lenet", art, other) == other.with_name("lenet-v2.parity.json")
    assert paths.report_path("digits_lenet", art, Path("/")) == own  # no name to put it beside

    def report(*argv: str) -> Path:
        args = build_parser().parse_args(["--artifacts-dir", str(art), "verify", *argv])
        return Path(VerifyConfig.from_args(args).report)

    assert report("--model", "digits_lenet") == own
    assert report("--model", "digits_lenet", "--export-dir", str(other)) == (
        tmp_path / "exports" / "lenet-v2.parity.json"
    )
    given = tmp_path / "mine.json"
    assert report("--export-dir", str(other), "--report", str(given)) == given
