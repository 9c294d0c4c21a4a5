"""End-to-end tier: a tiny playbook with real TensorFlow on real namespaces, its report,
and its resumption after a lost run (root, slow)."""

from __future__ import annotations

import csv
import json
import struct
import subprocess
from pathlib import Path

import pytest

from netbench import report
from netbench.testbed import netns as local
from tests.conftest import NETBENCH, ROOT, netbench_processes
from tests.unit.test_report_figures import outside, runs_off_their_marks

pytestmark = [pytest.mark.root, pytest.mark.tf]

SMOKE = ROOT / "playbooks" / "smoke.yaml"


def netbench(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([*NETBENCH, *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))}


def test_smoke_playbook_runs_reports_and_resumes(clean_machine, tmp_path):
    out = tmp_path / "results"
    first = netbench("run", str(SMOKE), "--output", str(out))
    assert "0 already done, 2 to run" in first.stdout
    done = records(out)
    assert set(done) == {"r000", "r001"}
    assert all(r["status"] == "ok" and r["model"] == "mlp" and r["batch_size"] == 32 for r in done.values()), done
    by_delay = {r["profile"]["delay_us"]: r["stats"]["images_per_sec"] for r in done.values()}
    assert set(by_delay) == {1_000, 40_000}
    assert by_delay[40_000] < by_delay[1_000] / 2, by_delay  # an 80 ms round trip per all-reduce
    plan = json.loads((out / "playbook.json").read_text())
    assert plan["seed"] == 4 and len(plan["runs"]) == 2 and len(plan["sessions"]) == 1
    # the seeded order put the 40 ms point first (see the dry run of smoke.yaml)
    assert done["r000"]["profile"]["delay_us"] == 40_000

    report_out = tmp_path / "report"
    netbench("report", str(out), "--output", str(report_out))
    png = (report_out / "throughput-latency.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == report.PANEL_PX
    text = (report_out / "report.md").read_text()
    assert "| mlp | allreduce | 1 | 40 | 1 |" in text and "none (one run)" in text
    assert (report_out / "report.html").read_text().count("data:image/png;base64,") == 1
    # the figure of the real runs, as the renderer lays it out: everything inside, runs on their markers
    groups = report.group_observations(report.load_observations(out))
    fig = report.build_metric_figure(groups, report.THROUGHPUT, "latency_ms", 0.95)
    assert outside(fig) == [] and runs_off_their_marks(fig) == []

    # an interrupted playbook: r000's record is lost; a second run repeats only r000
    kept = (out / "runs" / "r001.json").read_text()
    (out / "runs" / "r000.json").unlink()
    second = netbench("run", str(SMOKE), "--output", str(out))
    assert "1 already done, 1 to run" in second.stdout
    assert (out / "runs" / "r001.json").read_text() == kept
    again = records(out)
    assert again["r000"]["status"] == "ok" and again["r000"]["profile"]["delay_us"] == 40_000
    with open(out / "results.csv", newline="") as fh:
        rows = [row["run_id"] for row in csv.DictReader(fh)]
    # the second session repeated only r000, and its row replaced the lost record's: a resume never
    # leaves two rows for one run
    assert sorted(rows) == ["r000", "r001"]
    assert len(json.loads((out / "playbook.json").read_text())["sessions"]) == 2
    third = netbench("run", str(SMOKE), "--output", str(out))
    assert "all 2 runs are done" in third.stdout
    assert local.list_netbench_netns() == []
    assert netbench_processes() == []
