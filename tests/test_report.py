"""netbench.report: grouping, t intervals, scaling efficiency, figures from a fixture folder."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from netbench import cli, report
from netbench.report import Observation, axis_scale, baseline_slice, group_observations, scaling_efficiency, t_interval


def record(run_id: str, *, delay_ms: float = 0, rate_mbit: float | None = None, loss_pct: float = 0,
           strategy: str = "allreduce", model: str = "mlp", batch: int = 32, workers: int = 2, repeat: int = 0,
           ips: float | None = 100.0, status: str = "ok") -> dict:
    """A runs/<id>.json record as the runner writes it (RunResult as a dict)."""
    return {
        "run_id": run_id, "schema_version": 1, "backend": "userspace", "strategy": strategy, "model": model,
        "batch_size": batch, "workers": workers, "repeat": repeat, "warmup_steps": 2, "status": status,
        "error": "" if status == "ok" else "no the next step within 1s",
        "profile": {"name": "p", "delay_us": int(delay_ms * 1000), "jitter_us": 0, "loss": loss_pct / 100,
                    "rate_bps": None if rate_mbit is None else int(rate_mbit * 1e6)},
        "stats": None if ips is None else {"images_per_sec": ips, "steps": 5},
        "events": [], "per_worker_images_per_sec": [],
    }


def write_results(directory: Path, records: list[dict]) -> Path:
    (directory / "runs").mkdir(parents=True)
    for rec in records:
        (directory / "runs" / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    return directory


def obs(run_id, ips, status="ok", **kw) -> Observation:
    return report.observation_from_record(record(run_id, ips=ips, status=status, **kw))


# ---------------------------------------------------------------- statistics

def test_t_interval_matches_a_hand_computed_case():
    # values 10, 12, 14: mean 12, s = 2, n = 3, t(0.995, 2) = 9.924843 (tables)
    interval = t_interval([10.0, 12.0, 14.0], 0.99)
    half = 9.924843 * 2 / math.sqrt(3)  # 11.46022
    assert interval.n == 3 and interval.mean == 12.0
    assert interval.low == pytest.approx(12 - half, abs=1e-4)
    assert interval.high == pytest.approx(12 + half, abs=1e-4)
    # 95 %: t(0.975, 2) = 4.302653
    assert t_interval([10.0, 12.0, 14.0], 0.95).half_width == pytest.approx(4.302653 * 2 / math.sqrt(3), abs=1e-4)


def test_t_interval_of_one_value_has_no_bounds():
    interval = t_interval([7.5])
    assert (interval.n, interval.mean, interval.low, interval.high) == (1, 7.5, None, None)
    with pytest.raises(ValueError):
        t_interval([])


def test_groups_are_points_and_timeouts_carry_no_throughput():
    observations = [obs("r000", 100, delay_ms=1), obs("r001", 50, delay_ms=10, repeat=0),
                    obs("r002", 110, delay_ms=1, repeat=1), obs("r003", None, status="timeout", delay_ms=10, repeat=1),
                    obs("r004", None, status="failed", delay_ms=10, repeat=2)]
    groups = group_observations(observations)
    assert [g.get("latency_ms") for g in groups] == [1.0, 10.0]
    fast, slow = groups
    assert fast.values == [100, 110] and fast.interval.mean == 105 and fast.interval.n == 2
    assert slow.values == [50] and slow.interval.low is None
    assert (slow.timeouts, slow.failed) == (1, 1)


def test_scaling_efficiency_against_single_process_runs():
    observations = [obs("r000", 40, strategy="single", workers=1), obs("r001", 60, strategy="single", workers=1, repeat=1),
                    obs("r002", 80, workers=2), obs("r003", 100, workers=2, repeat=1),
                    obs("r004", 75, workers=3),
                    obs("r005", 500, workers=2, model="cnn")]  # no cnn baseline: no efficiency
    effs = scaling_efficiency(group_observations(observations))
    assert [(e.group.get("workers"), e.baseline) for e in effs] == [(2, 50.0), (3, 50.0)]
    two, three = effs
    assert two.values == (0.8, 1.0) and two.interval.mean == pytest.approx(0.9)
    assert three.values == (0.5,)


def test_baseline_slice_keeps_the_best_level_of_other_network_factors():
    observations = [obs(f"r{i:03d}", 10, delay_ms=d, rate_mbit=r, loss_pct=l)
                    for i, (d, r, l) in enumerate([(1, 250, 0), (10, 250, 0), (1, 1000, 0), (10, 1000, 0),
                                                   (1, 1000, 1), (10, 1000, 1)])]
    groups = group_observations(observations)
    latency = baseline_slice(groups, "latency_ms")
    assert {(g.get("latency_ms"), g.get("bandwidth_mbit"), g.get("loss_pct")) for g in latency} == \
        {(1.0, 1000.0, 0.0), (10.0, 1000.0, 0.0)}
    bandwidth = baseline_slice(groups, "bandwidth_mbit")
    assert {(g.get("latency_ms"), g.get("bandwidth_mbit")) for g in bandwidth} == {(1.0, 250.0), (1.0, 1000.0)}


@pytest.mark.parametrize("levels, scale", [([1, 10, 100], "log"), ([250, 500, 1000], "linear"),
                                           ([0, 1, 10], "symlog"), ([10, 100, 200], "log"), ([5], "linear")])
def test_axis_scale_is_log_where_levels_span_decades(levels, scale):
    assert axis_scale(levels) == scale


# ---------------------------------------------------------------- figures from a fixture folder

def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def fixture_results(tmp_path) -> Path:
    """Two models x latency 1/10/100 ms x loss 0/1 %, 3 repetitions, one timeout, single baselines."""
    records, i = [], 0
    for model, base in (("mlp", 1000.0), ("cnn", 200.0)):
        for delay in (1, 10, 100):
            for loss in (0, 1):
                for rep in range(3):
                    timed_out = model == "cnn" and delay == 100 and loss == 0 and rep == 2
                    ips = None if timed_out else base / (1 + delay / 10) / (1 + loss) + rep
                    records.append(record(f"r{i:03d}", delay_ms=delay, loss_pct=loss, model=model, repeat=rep,
                                          ips=ips, status="timeout" if timed_out else "ok"))
                    i += 1
        for rep in range(3):
            records.append(record(f"r{i:03d}", strategy="single", workers=1, model=model, repeat=rep,
                                  delay_ms=1, ips=base / 1.5 + rep))
            i += 1
    return write_results(tmp_path / "results", records)


def test_report_renders_figures_and_summary(fixture_results, tmp_path):
    out = tmp_path / "report"
    written = report.write_report(fixture_results, out)
    names = sorted(p.name for p in written.files)
    assert names == ["report.md", "scaling-efficiency.png", "throughput-latency.png", "throughput-loss.png"]
    width, height = report.PANEL_PX
    for name in ("throughput-latency.png", "throughput-loss.png", "scaling-efficiency.png"):
        assert png_size(out / name) == (2 * width, height), name  # one panel per model: cnn, mlp
    text = (out / "report.md").read_text()
    assert "# Report: results" in text and "99%" in text and "timeout" in text
    # the mlp latency slow-down at loss 0: 1 ms -> 100 ms means (1000/1.1+1) vs (1000/11+1)
    fast, slow = 1000 / 1.1 + 1, 1000 / 11 + 1
    assert f"| mlp | allreduce | 1 | 100 | {slow / fast:.0%} |" in text
    # every design point row carries its hand-checkable interval
    values = [1000 / 1.1 / 2 + r for r in range(3)]  # mlp, 1 ms, loss 1 %
    i = t_interval(values, 0.99)
    assert f"{i.low:,.1f} .. {i.high:,.1f}" in text


def test_report_command_prints_tables(fixture_results):
    result = CliRunner().invoke(cli.main, ["report", str(fixture_results)])
    assert result.exit_code == 0, result.output
    assert "design points" in result.output and "r000" in result.output
    assert (fixture_results / "report" / "throughput-latency.png").exists()


def test_ps_settings_and_idleness_come_from_the_record():
    rec = {**record("r000", strategy="ps", workers=3), "ps": 2, "idle_ratio": 0.25}
    o = report.observation_from_record(rec)
    assert (o.get("ps"), o.get("accum_steps"), o.idleness) == (2, None, 0.25)
    table = report.runs_table([o, report.observation_from_record(record("r001", strategy="ps", workers=1))])
    assert [c.header for c in table.columns][-2] == "idle"


def test_report_on_a_folder_without_runs_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(cli.main, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "no run records" in result.output and str(tmp_path) in result.output
