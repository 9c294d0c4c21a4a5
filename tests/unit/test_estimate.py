"""A design's estimated wall time: the launch/isolate arithmetic, the step model, calibration
from a results folder, and what --dry-run prints."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.cli.render_estimate import estimate_lines
from netbench.errors import UsageError
from netbench.experiment.estimate import Costs, estimate_design, step_s
from netbench.experiment.launch import Settle
from netbench.experiment.store import CSV_COLUMNS
from netbench.model.job import JobSpec
from netbench.model.pairs import PairLink, PairTopology, scaled
from netbench.model.profile import Profile
from netbench.model.run import Run

ROOT = Path(__file__).resolve().parents[2]

# Round numbers: no contention, no fixed costs but the ones a test sets.
PLAIN = Costs(s_per_sample={"mlp": 0.001}, step_overhead_s={}, startup_s={"mlp": 4.0}, cluster_startup_s=1.0,
              cluster_round_trips=0, ps_round_trips=7, sync_overhead_s=0.0, point_overhead_s=0.5, stop_s=1.0, cores=64,
              loss_penalty=False, model_bytes={"mlp": 1_000_000}, unshaped_bps=1e9)


def _run(index: int, delay_ms: float = 0, rate_mbit: float | None = None, loss: float = 0.0, *,
         strategy: str = "allreduce", workers: int = 2, batch: int = 100, warmup: int = 2, steps: int = 10,
         accum: int = 4, repeat: int = 0) -> Run:
    profile = Profile(name=f"p{index}", delay_us=int(delay_ms * 1000), loss=loss,
                      rate_bps=None if rate_mbit is None else int(rate_mbit * 1e6))
    job = JobSpec(strategy=strategy, model="mlp", batch_size=batch, warmup=warmup, steps=steps, accum_steps=accum)
    return Run(index=index, profile=profile, repeat=repeat, job=job, workers=workers)


def test_a_per_pair_topology_is_modelled_by_its_slowest_path_at_its_scale():
    near = Profile(name="near", delay_us=2_000)
    far = Profile(name="far", delay_us=25_000, rate_bps=100_000_000)
    regions = PairTopology(name="two", nodes=("n1", "n2", "n3"),
                           links=(PairLink("n1", "n2", near), PairLink("n1", "n3", far), PairLink("n3", "n1", far)))
    base = replace(_run(0), profile=Profile(name="two@1"))  # a topology point's profile is a placeholder
    one, four = replace(base, pairs=regions), replace(base, pairs=scaled(regions, 4))
    # the ring waits on n1 <-> n3: 25 ms one-way and 100 Mbit/s, delays times the scale
    assert step_s(one, PLAIN) == pytest.approx(step_s(_run(0, delay_ms=25, rate_mbit=100), PLAIN))
    assert step_s(four, PLAIN) == pytest.approx(step_s(_run(0, delay_ms=100, rate_mbit=100), PLAIN))
    assert step_s(four, PLAIN) > step_s(one, PLAIN) > step_s(base, PLAIN)


def test_allreduce_step_is_compute_plus_ring_transfer_plus_round_trips():
    run = _run(0, delay_ms=10, rate_mbit=100, workers=2, batch=100)
    # compute 0.1 s; ring: 2 (W-1)/W x 1 MB x 8 / 100 Mbit = 0.08 s; 2 (W-1) round trips of 20 ms
    # (x 1514/1448: the rate limits whole frames, a 1448-byte segment rides a 1514-byte frame)
    assert step_s(run, PLAIN) == pytest.approx(0.1 + 0.08 * 1514 / 1448 + 0.04)


def test_accumulation_spreads_one_all_reduce_over_k_batches():
    plain = step_s(_run(0, delay_ms=10, rate_mbit=100), PLAIN)
    accum = step_s(_run(0, delay_ms=10, rate_mbit=100, strategy="allreduce-accum", accum=4), PLAIN)
    assert accum == pytest.approx(plain + 3 * 0.1)  # three more batches of compute, the same one all-reduce


def test_one_process_has_no_communication_and_ps_shares_the_servers_link():
    assert step_s(_run(0, delay_ms=100, rate_mbit=1, strategy="single", workers=1), PLAIN) == pytest.approx(0.1)
    ps = _run(0, delay_ms=1, rate_mbit=100, strategy="ps", workers=3)
    per_worker = 0.1 + 2 * 0.08 + 7 * 0.002  # compute, read and push 1 MB, the round trips
    assert step_s(ps, PLAIN) == pytest.approx(max(per_worker / 3, 0.08))


def test_loss_caps_the_rate_only_with_the_penalty_on():
    lossy = _run(0, delay_ms=10, rate_mbit=1000, loss=0.01)
    assert step_s(lossy, PLAIN) == pytest.approx(step_s(_run(0, delay_ms=10, rate_mbit=1000), PLAIN))
    assert step_s(lossy, replace(PLAIN, loss_penalty=True)) > 2 * step_s(lossy, PLAIN)


def test_a_launch_pays_start_up_once_and_settles_every_later_point():
    runs = [_run(i, delay_ms=0, rate_mbit=1000) for i in range(3)]  # one job configuration
    step = step_s(runs[0], PLAIN)
    settle = Settle(steps=3, seconds=1.5, round_trips=0)  # a fixed floor (test_settling: by the link)
    shared = estimate_design(runs, False, settle, PLAIN)
    isolated = estimate_design(runs, True, settle, PLAIN)
    startup = 4.0 + 1.0 + 2 * step  # process start-up, cluster set-up, warm-up
    assert (len(shared.launches), shared.process_starts) == (1, 2)
    assert (len(isolated.launches), isolated.process_starts) == (3, 6)
    assert shared.startup_s == pytest.approx(startup)
    assert isolated.startup_s == pytest.approx(3 * startup)
    assert shared.measured_s == isolated.measured_s == pytest.approx(3 * 10 * step)
    assert isolated.settle_s == 0
    assert shared.settle_s == pytest.approx(2 * (max(1.5, 3 * step) + step / 2))  # not the first point
    assert shared.other_s == pytest.approx(3 * 0.5 + 1.0)
    assert isolated.other_s == pytest.approx(3 * (0.5 + 1.0))
    assert shared.wall_s == pytest.approx(shared.startup_s + shared.settle_s + shared.measured_s + shared.other_s)
    assert shared.wall_s < isolated.wall_s and shared.measured_share > isolated.measured_share


def test_launches_follow_the_job_configuration_and_the_repetition():
    runs = [_run(0), _run(1, batch=50), _run(2, repeat=1), _run(3)]
    assert len(estimate_design(runs, False, Settle(), PLAIN).launches) == 3
    assert estimate_design(runs, False, Settle(), PLAIN).runs == 4


def test_a_point_past_the_step_timeout_counts_the_timeout_and_restarts_its_launch():
    runs = [_run(0, rate_mbit=1000), _run(1, rate_mbit=0.01), _run(2, rate_mbit=1000)]
    est = estimate_design(runs, False, Settle(), PLAIN, step_timeout_s=60)
    assert est.timeouts == 1
    hit = next(launch for launch in est.launches if launch.timeouts)
    assert hit.runs[-1] == "r001" and hit.other_s == pytest.approx(60 + 1.0 + 0.5 * (len(hit.runs) - 1))
    assert sum(len(launch.runs) for launch in est.launches) == 3
    assert len(est.launches) == (2 if len(est.launches[0].runs) < 3 else 1)  # the points after it: a new launch
    assert est.measured_s == pytest.approx(2 * 10 * step_s(runs[0], PLAIN))


def _results(folder: Path, rows: list[dict], records: list[dict]) -> Path:
    folder.mkdir()
    with (folder / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in CSV_COLUMNS})
    (folder / "runs").mkdir()
    for record in records:
        (folder / "runs" / f"{record['run_id']}.json").write_text(json.dumps(record))
    return folder


def _row(run_id: str, median: float, **extra) -> dict:
    return {"run_id": run_id, "delay_ms": 10.0, "jitter_ms": 0.0, "rate_mbit": 100.0, "loss_pct": 0.0,
            "strategy": "allreduce", "model": "mlp", "batch_size": 100, "workers": 2, "repeat": 0,
            "warmup_steps": 2, "steps": 10, "accum_steps": 1, "ps": 0, "model_bytes": 1_000_000,
            "step_time_median_s": median, "status": "ok", **extra}


def _record(run_id: str, started: float, ended: float, launch, window: float, settle_s=None) -> dict:
    steps = [{"event": "step", "phase": "measured", "role": "worker", "worker": 0, "start": 100.0, "end": 100.0 + window}]
    return {"run_id": run_id, "strategy": "allreduce", "started": started, "ended": ended, "launch": launch,
            "settle_s": settle_s, "events": steps}


def test_from_results_inverts_the_step_model_and_reads_start_up_and_point_overhead(tmp_path):
    base = replace(PLAIN, s_per_sample={"mlp": 0.005, "resnet50": 0.02}, source="base")
    truth = replace(base, s_per_sample={"mlp": 0.002})
    step = step_s(_run(0, delay_ms=10, rate_mbit=100), truth)  # what the fixture "measured"
    folder = _results(tmp_path / "r", [_row("r000", step), _row("r001", step), _row("r002", 9.9, status="failed")], [
        # the launch's first point: 9 s wall = start-up + warm-up + window + point overhead
        _record("r000", 1000.0, 1009.0, 0, window=10 * step),
        # a later point: 4 s wall = settle 1.5 + window + the point's own overhead
        _record("r001", 1009.0, 1013.0, 0, window=2.0, settle_s=1.5),
    ])
    costs = Costs.from_results(folder, base)
    assert costs.s_per_sample["mlp"] == pytest.approx(0.002, rel=1e-6)
    assert costs.s_per_sample["resnet50"] == 0.02  # not in the folder: the base's
    startup = 9.0 - 10 * step - 2 * step - base.point_overhead_s - base.cluster_startup_s
    assert costs.startup_s["mlp"] == pytest.approx(startup)
    assert costs.point_overhead_s == pytest.approx(4.0 - 2.0 - 1.5)
    assert str(folder) in costs.source and "mlp" in costs.source


def test_from_results_needs_a_results_csv(tmp_path):
    with pytest.raises(UsageError, match="results.csv"):
        Costs.from_results(tmp_path)


def test_estimate_lines_give_both_modes_their_split_and_assumptions():
    runs = [_run(i, rate_mbit=1000) for i in range(3)]
    shared, isolated = (estimate_design(runs, mode, Settle(), PLAIN) for mode in (False, True))
    lines = estimate_lines(shared, isolated, PLAIN)
    assert lines[0].startswith("estimated wall time --launch (this run):")
    assert lines[1].startswith("estimated wall time --isolate (other mode):")
    assert f"({shared.measured_share:.0%})" in lines[0] and "1 launch(es)" in lines[0]
    assert "3 launch(es), 6 process starts" in lines[1]
    assert lines[2].startswith("  assumes:") and "loss not modelled" in lines[2]


def test_dry_runs_print_the_estimate_of_both_modes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = CliRunner().invoke(cli.main, ["sweep", "--dry-run", "--latency", "1,10ms", "--launch"])
    assert sweep.exit_code == 0, sweep.output
    assert "estimated wall time --launch (this run)" in sweep.output
    assert "estimated wall time --isolate (other mode)" in sweep.output
    book = CliRunner().invoke(cli.main, ["run", str(ROOT / "playbooks" / "accumulation.yaml"), "--dry-run",
                                         "--output", str(tmp_path / "out")])
    assert book.exit_code == 0, book.output
    assert "for 315 runs in 315 launch(es)" in book.output  # every run is its own job configuration


# ---------------------------------------------------------------- a precision's window

def test_steps_for_precision_is_the_least_n_whose_interval_is_expected_within_it():
    from netbench import stats

    # cv 0.1 at 2 %: 125 steps make 11 batches, t(10) = 2.228: 2.228 x 0.1 / sqrt(125) = 1.993 %;
    # 124 steps (also 11 batches) give 2.001 %
    assert stats.steps_for_precision(0.1, 0.02) == 125
    assert stats.steps_for_precision(0.0, 0.02) == 2 * stats.MIN_BATCHES  # no interval below that
    for cv, precision in ((0.05, 0.03), (0.16, 0.02), (0.3, 0.005)):
        n = stats.steps_for_precision(cv, precision)
        def width(k):
            return stats.t_critical(0.95, stats.batch_count(k) - 1) * cv / k ** 0.5
        assert width(n) <= precision < width(n - 1)
    # half the width takes a little under 4x the steps: more batches, a smaller t
    assert 3 * 125 < stats.steps_for_precision(0.1, 0.01) < 4 * 125
    with pytest.raises(ValueError):
        stats.steps_for_precision(-0.1, 0.02)


def _precise(run: Run, precision: float | None, max_seconds: float = 60.0, **job) -> Run:
    return replace(run, job=replace(run.job, precision=precision, max_seconds=max_seconds, **job))


def test_a_precision_lengthens_the_modelled_window_up_to_its_cap():
    from netbench.experiment.estimate import window_s

    costs = replace(PLAIN, step_cv=0.1)
    job = _run(0).job  # 10 steps
    assert window_s(job, 0.1, costs) == (pytest.approx(1.0), False)  # no precision: the steps
    job = replace(job, precision=0.02, max_seconds=60.0)
    assert window_s(job, 0.1, costs) == (pytest.approx(12.5), False)  # 125 steps (cv 0.1 at 2 %)
    assert window_s(job, 1.0, costs) == (pytest.approx(60.0), True)  # 125 s wanted: capped
    assert window_s(replace(job, steps=200), 0.1, costs) == (pytest.approx(20.0), False)  # --steps is the least
    # a least window past the cap is measured whole, and still short of the precision
    assert window_s(replace(job, steps=100), 1.0, costs) == (pytest.approx(100.0), True)
    assert window_s(replace(job, train_steps=50), 0.1, costs) == (pytest.approx(1.0), False)  # accuracy runs
    calibrated = replace(costs, step_cv_by_model={"mlp": 0.05})
    assert window_s(job, 0.1, calibrated)[0] == pytest.approx(0.1 * 35)  # 8 batches of 4-5: t(7) x 0.05 / sqrt(35)


def test_the_estimate_counts_points_expected_to_stop_at_the_cap():
    costs = replace(PLAIN, step_cv=0.16)
    fast, slow = _run(0, rate_mbit=1000), _run(1, rate_mbit=10)  # 0.1 s and ~0.96 s steps
    runs = [_precise(fast, 0.02), _precise(slow, 0.02)]
    est = estimate_design(runs, False, Settle(), costs)
    assert est.capped == 1
    assert est.measured_s == pytest.approx(289 * step_s(fast, costs) + 60.0)  # 289 steps at cv 0.16, 2 %
    lines = estimate_lines(est, estimate_design(runs, True, Settle(), costs), costs, precision=True)
    assert "1 point(s) expected to stop at --max-seconds short of their precision" in lines[0]
    assert "coefficient of variation 0.16" in lines[2]
    assert "coefficient of variation" not in estimate_lines(est, est, costs)[2]


def test_from_results_calibrates_the_step_cv_from_the_rows_intervals(tmp_path):
    from netbench import stats

    t = stats.t_critical(0.95, stats.batch_count(100) - 1)  # 100 steps: 10 batches
    rows = [_row(f"r00{i}", 0.2, steps=100, step_time_ci_pct=100 * cv * t / 10) for i, cv in enumerate((0.1, 0.2, 0.3))]
    costs = Costs.from_results(_results(tmp_path / "r", rows, []), PLAIN)
    assert costs.cv("mlp") == pytest.approx(0.2)
    assert costs.cv("resnet50") == PLAIN.step_cv  # not in the folder: the assumed one


@pytest.mark.parametrize("content, message", [
    ("run_id,status,step_time_median_s\nr000,ok," + "9" * 200_000 + "\n", "line 2: not a results CSV: field larger"),
    ("run_id,status,step_time_median_s,model,strategy\nr000,ok,fast,mlp,allreduce\n", "not a results CSV: ValueError"),
    ("run_id,status,step_time_median_s\nr000,ok,0.1\n", "not a results CSV: KeyError: 'strategy'"),
])
def test_from_results_refuses_a_hostile_csv_in_one_line_naming_it(tmp_path, content, message):
    (tmp_path / "results.csv").write_text(content)
    with pytest.raises(UsageError) as caught:
        Costs.from_results(tmp_path)
    assert caught.value.message.startswith(f"{tmp_path / 'results.csv'}: ")
    assert message in caught.value.message and "\n" not in caught.value.message
    assert len(caught.value.message) < 400


def test_a_dry_run_with_a_precision_models_its_windows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(cli.main, ["sweep", "--dry-run", "--latency", "1ms", "--bandwidth", "10mbit,1gbit",
                                        "--precision", "2%"])
    assert out.exit_code == 0, out.output
    assert "expected to stop at --max-seconds short of their precision" in out.output  # 10 Mbit/s: ~1 s steps
    assert "assumed coefficient of variation 0.10" in " ".join(out.output.split())
    # the bound counts the 10 Mbit/s point's least window (32 steps without --steps: about 72 s, past the cap)
    # whole: 72 + 60 s
    assert "32 measured steps at least" in out.output
    assert "(at most 2.2 min of windows for these runs at the modelled steps)" in " ".join(out.output.split())
    off = CliRunner().invoke(cli.main, ["sweep", "--dry-run", "--latency", "1ms", "--precision", "off"])
    assert off.exit_code == 0 and "coefficient of variation" not in off.output
