"""`netbench report` on a results folder someone else wrote (or half wrote): missing, garbled
or mis-shaped results.csv, run records of the wrong schema. Each is refused in one line naming
the file, non-zero exit, no traceback, within seconds; or, where the records alone make a report
(results.csv is optional), the report is written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from tests.unit.report_designs import record, write_results


def _folder(tmp_path: Path) -> Path:
    records = [record(f"r{i:03d}", delay_ms=delay, repeat=rep, ips=100.0 / delay + rep)
               for i, (delay, rep) in enumerate((d, r) for d in (1, 10) for r in range(2))]
    return write_results(tmp_path / "results", records, {rec["run_id"]: {"images_per_sec": 1.0} for rec in records})


def _run_json(folder: Path, text: str | bytes) -> None:
    path = folder / "runs" / "r000.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _record_with(**changes):
    def change(folder: Path) -> None:
        data = json.loads((folder / "runs" / "r000.json").read_text())
        data.update(changes)
        (folder / "runs" / "r000.json").write_text(json.dumps(data))
    return change


BROKEN = {
    "results-csv-binary": (lambda f: (f / "results.csv").write_bytes(b"\xff\xfe\x00\x00\x81garbage\x00"), "results.csv"),
    "results-csv-a-folder": (lambda f: ((f / "results.csv").unlink(), (f / "results.csv").mkdir()), "results.csv"),
    "results-csv-huge-field": (lambda f: (f / "results.csv").write_text("run_id,x\nr000," + "9" * 200_000 + "\n"),
                               "results.csv"),
    "record-not-json": (lambda f: _run_json(f, "{not json"), "r000.json"),
    "record-binary": (lambda f: _run_json(f, b"\xff\xfe\x00garbage"), "r000.json"),
    "record-a-list": (lambda f: _run_json(f, "[1, 2, 3]"), "r000.json"),
    "record-a-number": (lambda f: _run_json(f, "42"), "r000.json"),
    "record-null": (lambda f: _run_json(f, "null"), "r000.json"),
    "record-no-run-id": (lambda f: _run_json(f, json.dumps({"status": "ok"})), "r000.json"),
    "record-future-schema": (_record_with(schema_version=9999), "r000.json"),
    "record-schema-text": (_record_with(schema_version="new"), "r000.json"),
    "record-stats-a-list": (_record_with(stats=[1, 2]), "r000.json"),
    "record-profile-a-string": (_record_with(profile="fast"), "r000.json"),
    "record-repeat-text": (_record_with(repeat="first"), "r000.json"),
    "record-curve-garbled": (_record_with(accuracy_curve=[{"step": "x"}]), "r000.json"),
    "record-curve-a-number": (_record_with(accuracy_curve=7), "r000.json"),
    "playbook-json-garbled": (lambda f: (f / "playbook.json").write_text("{]"), "playbook.json"),
    "playbook-json-runs-a-dict": (lambda f: (f / "playbook.json").write_text('{"runs": {"a": 1}}'), "playbook.json"),
    "manifest-garbled": (lambda f: (f / "manifest.json").write_text("[}"), "manifest.json"),
    "manifest-a-list": (lambda f: (f / "manifest.json").write_text("[]"), "manifest.json"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_report_refuses_a_broken_folder_in_one_line(case, tmp_path):
    folder = _folder(tmp_path)
    breaker, names = BROKEN[case]
    breaker(folder)
    began = time.monotonic()
    result = CliRunner().invoke(cli.main, ["report", str(folder)])
    assert time.monotonic() - began < 20
    assert result.exit_code not in (0, None), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and names in errors[0], result.output


@pytest.mark.parametrize("case", ["results-csv-missing", "results-csv-empty", "results-csv-header-only",
                                  "results-csv-other-columns", "results-csv-ragged", "results-csv-nul"])
def test_report_makes_do_with_the_records_when_results_csv_is_missing_or_odd(case, tmp_path):
    """results.csv is optional: the records alone make a report; a row it cannot use is skipped."""
    folder = _folder(tmp_path)
    csv_path = folder / "results.csv"
    {"results-csv-missing": lambda: csv_path.unlink(), "results-csv-empty": lambda: csv_path.write_text(""),
     "results-csv-header-only": lambda: csv_path.write_text("run_id,images_per_sec\n"),
     "results-csv-other-columns": lambda: csv_path.write_text("who,what\nx,y\n"),
     "results-csv-ragged": lambda: csv_path.write_text("run_id,a\nr000,1,2,3\nr001\n"),
     "results-csv-nul": lambda: csv_path.write_text("run_id,x\nr000,\0\n")}[case]()
    result = CliRunner().invoke(cli.main, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    assert (folder / "report" / "report.md").is_file()


def test_report_on_a_missing_folder_is_one_line(tmp_path):
    result = CliRunner().invoke(cli.main, ["report", str(tmp_path / "nowhere")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.lower().startswith("error")]) == 1
