"""netbench status: a campaign's progress from its folder alone (experiment/campaign_status.py):
runs done, failed and left per shard, each shard's state (a held lock is a running shard), the
time left from campaign.json's estimates at the pace so far, a stopped shard's last error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.experiment import campaign, campaign_status as cs
from tests.unit import campaign_folders as cf


def test_the_pace_is_measured_over_estimated_time_of_the_runs_done():
    states = [cs.RunState("r000", 0, 10.0, "ok", took_s=15.0), cs.RunState("r001", 0, 30.0, "timeout",
                                                                                  took_s=45.0),
              cs.RunState("r002", 1, 20.0, "failed", took_s=1.0), cs.RunState("r003", 1, 20.0)]
    assert cs.pace(states) == pytest.approx(60 / 40)
    assert cs.pace(states[2:]) is None
    shard = cs.shard_progress(1, states, cs.STOPPED, "h", 1.5, "slurm/x.out: error: boom")
    assert (shard.done, shard.left, shard.left_s, shard.failed) == (0, 2, pytest.approx(60.0), (("r002", "failed"),))
    assert shard.last_error == "slurm/x.out: error: boom"
    done = cs.shard_progress(0, states, cs.STOPPED, "h", 1.5, "old error")
    assert (done.state, done.left, done.left_s, done.last_error) == (cs.DONE, 0, 0.0, "")


@pytest.fixture
def half_done(tmp_path):
    b = cf.four_points()
    record, runs = cf.make(tmp_path, b, 2)
    shard0 = [e["run_id"] for e in record["runs"] if e["shard"] == 0]
    shard1 = [e["run_id"] for e in record["runs"] if e["shard"] == 1]
    for run_id in shard0:
        cf.record_run(tmp_path, record, runs, run_id, took_s=2 * next(e["estimate_s"] for e in record["runs"]
                                                                        if e["run_id"] == run_id))
    cf.record_run(tmp_path, record, runs, shard1[0], status="failed", error="no measured steps")
    cf.record_run(tmp_path, record, runs, shard1[1])
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "shard-1.job-7.out").write_text("old\n")
    (tmp_path / "slurm" / "shard-1.job-9.out").write_text(
        "r001 ...\nslurmstepd: error: *** JOB 10 ON n2 CANCELLED AT 2026-12-07T10:00:00 ***\n")
    return tmp_path, record, shard0, shard1


def test_progress_per_shard_from_the_folder(half_done):
    folder, record, shard0, shard1 = half_done
    progress = cs.progress(folder)
    s0, s1 = progress.shards
    assert (s0.state, s0.host, s0.done, s0.runs, s0.left) == (cs.DONE, "", 4, 4, 0)
    assert (s1.state, s1.done, s1.left) == (cs.STOPPED, 1, 3)
    assert s1.failed == ((shard1[0], "no measured steps"),)
    assert s1.last_error.startswith("slurm/shard-1.job-9.out: slurmstepd: error: *** JOB 10 ON n2 CANCELLED")
    # the pace: shard 0's runs took twice their estimates, shard 1's one ok run exactly 10 s
    left = [e["estimate_s"] for e in record["runs"] if e["run_id"] in shard1 and e["run_id"] != shard1[1]]
    assert progress.pace is not None and progress.pace > 1.5
    assert s1.left_s == pytest.approx(sum(left) * progress.pace)
    assert progress.left_at_once_s == pytest.approx(s1.left_s) and progress.left == 3


def test_a_shard_whose_lock_is_held_is_running(half_done):
    folder, *_ = half_done
    with campaign.ShardLock(campaign.shard_dir(folder, 1)):
        s1 = cs.progress(folder).shards[1]
        assert s1.state == cs.RUNNING and s1.last_error == ""  # its old output is not its state now
    assert cs.progress(folder).shards[1].state == cs.STOPPED


def test_a_shard_not_begun_is_not_started(tmp_path):
    record, _ = cf.make(tmp_path, cf.four_points(), 2)
    progress = cs.progress(tmp_path)
    assert [s.state for s in progress.shards] == [cs.NOT_STARTED, cs.NOT_STARTED]
    assert progress.pace is None
    assert progress.left_in_turn_s == pytest.approx(sum(e["estimate_s"] for e in record["runs"]))


def test_the_status_command_prints_it(half_done):
    folder, record, shard0, shard1 = half_done
    result = CliRunner().invoke(cli.main, ["status", str(folder)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "8 runs in 2 shards by repetitions" in out and "seed 11" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert rows["0"][1:3] == ["done", "-"] and rows["0"][3:6] == ["4/4", "0", "0"]
    assert rows["1"][1:2] == ["stopped"] and rows["1"][3:6] == ["1/4", "1", "3"]
    assert f"failed: shard 1 {shard1[0]}: no measured steps" in out
    assert "CANCELLED" in out and "left: 3 of 8 runs" in out and "x the estimate so far" in out
    assert "runs what is missing" in out


def test_status_of_a_finished_campaign_says_report(tmp_path):
    record, runs = cf.make(tmp_path, cf.four_points(), 2)
    cf.record_all(tmp_path, record, runs)
    result = CliRunner().invoke(cli.main, ["status", str(tmp_path)])
    assert result.exit_code == 0 and f"all 8 runs done: the answer: netbench report {tmp_path}" in result.stdout


def test_status_of_a_folder_that_is_no_campaign_says_so(tmp_path):
    (tmp_path / "playbook.json").write_text("{}")
    result = CliRunner().invoke(cli.main, ["status", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {tmp_path}: not a campaign folder (no campaign.json)",
                                          "hint: a playbook's results folder: 'netbench report' it"]


def test_slurms_word_on_a_job_is_its_cause(tmp_path):
    (tmp_path / "shard-0.job-3.out").write_text(
        "slurmstepd: error: *** JOB 3 ON n1 DUE TO TIME LIMIT ***\nerror: interrupted\n")
    (tmp_path / "shard-1.job-3.out").write_text("error: a testbed is already up\nhint: use it\n")
    (tmp_path / "shard-2.job-3.out").write_text("all fine\n")
    assert cs.last_error(tmp_path, 0).endswith("*** JOB 3 ON n1 DUE TO TIME LIMIT ***")
    assert cs.last_error(tmp_path, 1) == f"{tmp_path.name}/shard-1.job-3.out: error: a testbed is already up"
    assert cs.last_error(tmp_path, 2) == "" and cs.last_error(tmp_path, 3) == ""


def test_a_submitted_shard_not_begun_is_queued_and_one_that_began_and_died_says_why(tmp_path):
    cf.make(tmp_path, cf.four_points(), 2)
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "submissions.json").write_text('[{"job_id": "5", "shards": [0, 1]}]')
    (tmp_path / "slurm" / "shard-0.job-5.out").write_text("error: netbench needs root\n")
    s0, s1 = cs.progress(tmp_path).shards
    assert (s0.state, s0.job, s0.began, s0.queued) == (cs.NOT_STARTED, "5_0", True, False)
    assert (s1.state, s1.job, s1.began, s1.queued) == (cs.NOT_STARTED, "5_1", False, True)
    out = CliRunner().invoke(cli.main, ["status", str(tmp_path)]).stdout
    assert "queued: 5_1 submitted and not begun" in out
    assert "shard 0: slurm/shard-0.job-5.out: error: netbench needs root" in out
    assert "shard(s) 0 not running" in out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["1"])
    assert row[1] == "queued" and row[-1] == "5_1"
