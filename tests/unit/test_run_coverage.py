"""report.coverage: whether a run's own interval covered the next repetition's mean step, and
the run-to-run spread against the within-run half-width (bench/step_noise.py --coverage)."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import statistics
from pathlib import Path

import pytest

from netbench import stats
from netbench.report import coverage as cover

ROOT = Path(__file__).resolve().parents[2]


def record(run_id, repeat, mean_s, ci_pct=2.0, profile="d1ms", status="ok", **extra):
    """A run record as runs/<id>.json holds it, with only what the study reads."""
    doc = {"run_id": run_id, "repeat": repeat, "status": status, "strategy": "allreduce", "model": "mlp",
           "batch_size": 64, "workers": 2, "profile": {"name": profile, "delay_us": 1000},
           "stats": {"mean_s": mean_s}, "step_time_ci_pct": ci_pct, **extra}
    return doc


def means(*records, rows=None):
    rows = rows or {}
    return [m for m in (cover.run_mean(r, rows.get(r["run_id"])) for r in records) if m is not None]


def test_each_run_interval_is_judged_against_the_next_repetitions_mean():
    # 2 % intervals: 1.00 -> 1.01 is covered (0.01 <= 0.02); 1.01 -> 1.05 is not (0.04 > 0.0202)
    runs = means(record("r002", 2, 1.05), record("r000", 0, 1.00), record("r001", 1, 1.01))  # any file order
    (point,) = cover.coverage(runs)
    assert (point.runs, point.pairs, point.covered, point.fraction) == (3, 2, 1, 0.5)
    centre = statistics.fmean([1.00, 1.01, 1.05])
    assert point.run_to_run_pct == pytest.approx(100 * statistics.stdev([1.00, 1.01, 1.05]) / centre)
    assert point.within_pct == pytest.approx(100 * statistics.fmean([0.02, 0.0202, 0.021]) / centre)
    assert point.ratio == pytest.approx(point.run_to_run_pct / point.within_pct)


def test_the_interval_is_the_first_runs_not_the_seconds():
    # a narrow run followed by a wide one: 1.00 +- 0.5 % does not reach 1.02; 1.02 +- 5 % would
    runs = means(record("r000", 0, 1.00, ci_pct=0.5), record("r001", 1, 1.02, ci_pct=5.0))
    assert cover.coverage(runs)[0].covered == 0
    runs = means(record("r000", 0, 1.00, ci_pct=5.0), record("r001", 1, 1.02, ci_pct=0.5))
    assert cover.coverage(runs)[0].covered == 1


def test_points_are_apart_and_a_point_run_once_or_a_failed_run_has_no_pair():
    runs = means(record("r000", 0, 1.0, profile="d1ms"), record("r001", 0, 2.0, profile="d50ms"),
                 record("r002", 1, 1.0, profile="d1ms"), record("r003", 1, 2.0, profile="d50ms", status="failed"),
                 record("r004", 0, 3.0, profile="d1ms", strategy="ps-sync"),
                 record("r005", 1, 3.3, profile="d1ms", strategy="ps-sync"))
    points = cover.coverage(runs)
    assert [(p.point, p.pairs, p.covered) for p in points] == [("d1ms strategy=allreduce", 1, 1),
                                                               ("d1ms strategy=ps-sync", 1, 0)]
    total = cover.overall(points)
    assert (total.runs, total.pairs, total.covered, total.fraction) == (4, 2, 1, 0.5)
    assert total.run_to_run_pct == pytest.approx((statistics.fmean([p.run_to_run_pct ** 2 for p in points])) ** 0.5)


def test_an_interval_comes_from_results_csv_or_from_the_chiefs_steps_when_the_record_lacks_it():
    bare = record("r000", 0, 1.0, ci_pct=None)
    assert cover.run_mean(bare, {"step_time_ci_pct": "3.0"}).half_s == pytest.approx(0.03)
    rng = random.Random(1)
    durations = [0.1 * (1 + 0.2 * rng.random()) for _ in range(64)]
    events = [{"event": "step", "phase": "measured", "step": k, "start": float(k), "duration": d, "worker": 0}
              for k, d in enumerate(durations)]
    events.append({"event": "step", "phase": "measured", "step": 0, "start": 0.0, "duration": 9.0, "worker": 1})
    run = cover.run_mean({**bare, "stats": {}, "events": events})
    assert run.mean_s == pytest.approx(statistics.fmean(durations))  # the chief's steps only
    assert run.half_s == pytest.approx(stats.batch_means_interval(durations).half_width)
    assert cover.run_mean({**bare, "stats": {}}) is None  # nothing measured
    assert cover.run_mean(record("r000", 0, 1.0, ci_pct=None), None).half_s is None
    (point,) = cover.coverage([cover.run_mean(record("r000", 0, 1.0, ci_pct=None)), *means(record("r001", 1, 1.0))])
    assert point.pairs == 0 and point.fraction is None  # the first run has no interval to judge by


def test_honest_intervals_cover_the_next_runs_mean_83_percent_of_the_time():
    assert cover.EXPECTED_COVERAGE == pytest.approx(0.834, abs=0.001)
    assert cover.EXPECTED_RATIO == pytest.approx(0.510, abs=0.001)
    rng = random.Random(11)
    se = 0.01  # runs whose means vary by exactly their own standard error
    runs = [cover.RunMean(f"r{i}", (("profile", "p"),), i, rng.gauss(1.0, se), 1.96 * se) for i in range(4000)]
    (point,) = cover.coverage(runs)
    assert point.fraction == pytest.approx(cover.EXPECTED_COVERAGE, abs=0.02)
    assert point.ratio == pytest.approx(cover.EXPECTED_RATIO, abs=0.02)
    # runs that differ by twice what their intervals say: plainly less coverage, twice the ratio
    loose = [cover.RunMean(r.run_id, r.point, r.repeat, 1 + 2 * (r.mean_s - 1), r.half_s) for r in runs]
    (point,) = cover.coverage(loose)
    assert point.fraction < 0.6 and point.ratio == pytest.approx(2 * cover.EXPECTED_RATIO, abs=0.05)


def _step_noise():
    spec = importlib.util.spec_from_file_location("step_noise", ROOT / "bench" / "step_noise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_noise_prints_the_coverage_of_a_results_folder(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    docs = [record("r000", 0, 1.00), record("r001", 1, 1.01), record("r002", 2, 1.05, ci_pct=None)]
    for doc in docs:
        (tmp_path / "runs" / f"{doc['run_id']}.json").write_text(json.dumps(doc))
    with open(tmp_path / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["run_id", "step_time_ci_pct"])
        writer.writeheader()
        writer.writerows([{"run_id": "r002", "step_time_ci_pct": "2.0"}])
    noise = _step_noise()
    assert noise.main([str(tmp_path), "--coverage"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:5] == ["d1ms", "3", "2", "1", "0.50"] and out[2].startswith("overall")
    assert "83%" in out[-1]
    assert noise.main([str(tmp_path), "--coverage", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["covered"] == 1 and rows[0]["pairs"] == 2 and rows[-1]["point"] == "overall"
    (tmp_path / "runs" / "r001.json").unlink()
    (tmp_path / "runs" / "r002.json").unlink()
    assert noise.main([str(tmp_path), "--coverage"]) == 2  # no point ran twice
    assert "--repeat N" in capsys.readouterr().err
