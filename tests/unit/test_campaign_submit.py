"""netbench submit: the batch script as data (cluster/script.py), squeue's answer read
(cluster/slurm.py), and the submission against a fake Slurm (tests/fakes/slurm.py): what is
submitted the first time and again, what a dry run prints and writes (nothing)."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.cluster import script, slurm
from netbench.cluster.script import BatchOptions, array_text, batch_script
from netbench.experiment import campaign
from tests.fakes.slurm import FakeSlurm
from tests.unit import campaign_folders as cf


def options(**changes) -> BatchOptions:
    base = dict(name="grid", playbook="/p/grid.yaml", campaign="/r/grid", shards=4, array=(0, 1, 2, 3),
                netbench=("/venv/bin/python", "-m", "netbench.cli"))
    return BatchOptions(**{**base, **changes})


def directives(text: str) -> list[str]:
    return [line[len("#SBATCH "):] for line in text.splitlines() if line.startswith("#SBATCH ")]


# ---------------------------------------------------------------- the script

def test_the_script_is_an_array_of_whole_nodes_running_each_shard():
    text = batch_script(options())
    assert text.startswith("#!/bin/bash\n")
    assert directives(text) == ["--job-name=netbench-grid", "--array=0-3", "--nodes=1", "--ntasks=1", "--exclusive",
                                "--output=/r/grid/slurm/shard-%a.job-%A.out"]
    last = text.strip().splitlines()[-1]
    assert last == ('exec /venv/bin/python -m netbench.cli run /p/grid.yaml --shard "$SLURM_ARRAY_TASK_ID/4" '
                    '--output /r/grid')
    # what bash runs for task 2: the shard's own command line
    words = shlex.split(last.replace("$SLURM_ARRAY_TASK_ID", "2"))
    assert words[words.index("--shard") + 1] == "2/4"


def test_the_users_sbatch_options_and_cores_per_task():
    text = batch_script(options(array=(1, 3), partition="compute", time="1-02:00", cpus_per_task=8,
                                sbatch_args=("--mem=8G", "--account=lab one")))
    got = directives(text)
    assert "--exclusive" not in got and "--cpus-per-task=8" in got
    assert got[1] == "--array=1,3"
    assert got[-4:] == ["--partition=compute", "--time=1-02:00", "--mem=8G", "'--account=lab one'"]


def test_paths_with_spaces_are_quoted():
    text = batch_script(options(playbook="/p/my grid.yaml", campaign="/r/my grid"))
    assert "--output='/r/my grid/slurm/shard-%a.job-%A.out'" in directives(text)
    assert shlex.split(text.strip().splitlines()[-1])[5] == "/p/my grid.yaml"


@pytest.mark.parametrize("indices, text", [((0,), "0"), ((0, 1, 2, 5), "0-2,5"), ((3, 1, 2), "1-3"),
                                           ((0, 2, 4), "0,2,4"), ((7, 8, 10, 11), "7-8,10-11")])
def test_array_ranges(indices, text):
    assert array_text(indices) == text


@pytest.mark.parametrize("changes, words", [
    ({"time": "two hours"}, "--time 'two hours'"), ({"time": "1:2:3:4"}, "--time"),
    ({"partition": "a b"}, "--partition 'a b'"), ({"cpus_per_task": 0}, "--cpus-per-task 0"),
    ({"sbatch_args": ("mem=8G",)}, "--sbatch-arg 'mem=8G'"), ({"sbatch_args": ("--array=0-9",)}, "sets the array"),
    ({"sbatch_args": ("-o x.out",)}, "sets the array, the output"), ({"sbatch_args": ("--mem=1G\nrm -rf /",)}, "one line"),
    ({"array": (4,)}, "each must be 0 to 3")])
def test_what_sbatch_would_refuse_is_refused_naming_the_flag(changes, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        batch_script(options(**changes))


@pytest.mark.parametrize("good", ["30", "2:00:00", "45:00", "1-0", "1-12:30", "2-00:00:00", "UNLIMITED"])
def test_slurms_time_formats_pass(good):
    script.check(options(time=good))


def test_squeue_lines_become_each_jobs_active_tasks():
    text = "12_3 R\n12_[4-6,9] PD\n13_0 R\n14 PD\n\n"
    assert slurm.parse_squeue(text) == {"12": {3, 4, 5, 6, 9}, "13": {0}}
    assert slurm.parse_squeue("12_[0-3%2] PD\n") == {"12": {0, 1, 2, 3}}


def test_without_sbatch_the_error_says_where_to_run(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    with pytest.raises(slurm.SlurmError, match="sbatch not found") as info:
        slurm.SlurmCluster().submit(tmp_path / "x.sh")
    assert "login node" in info.value.message


# ---------------------------------------------------------------- submitting

@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    queue = FakeSlurm()
    monkeypatch.setattr("netbench.cluster.slurm.SlurmCluster", lambda: queue)
    b = cf.four_points()
    path = tmp_path / "grid.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"name": "grid", "factors": {"latency": ["1ms", "20ms"],
                                                                "bandwidth": ["100mbit", "1gbit"]},
                                    "fixed": {"model": "mlp", "workers": 2, "strategy": "allreduce"},
                                    "repeat": 2, "seed": 11, "order": "random", "warmup": 1, "steps": 3,
                                    "precision": "off"}))
    return queue, path, b


def submit(*args: str):
    return CliRunner().invoke(cli.main, ["submit", *args])


def test_a_dry_run_prints_the_script_alone_on_stdout_and_writes_nothing(fake, tmp_path):
    queue, path, _ = fake
    result = submit(str(path), "--slurm", "--shards", "2", "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=netbench-grid\n#SBATCH --array=0-1\n")
    assert f"run {path} --shard \"$SLURM_ARRAY_TASK_ID/2\" --output {tmp_path / 'results' / 'grid'}" in result.stdout
    assert f"-m netbench.cli" in result.stdout and sys.executable in result.stdout
    assert "8 runs in 2 shards by repetitions" in result.stderr
    assert not (tmp_path / "results").exists() and queue.scripts == []


def test_submit_writes_the_campaign_and_prints_the_job_id_and_folder(fake, tmp_path):
    queue, path, b = fake
    result = submit(str(path), "--slurm", "--shards", "2", "--partition", "p1", "--sbatch-arg=--mem=2G")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "results" / "grid"
    assert "submitted job 100: array task(s) 0, 1 of 2 shards" in result.stdout
    assert f"netbench status results/grid" in result.stdout
    [(job, text)] = queue.scripts
    assert (folder / "slurm" / "submit-1.sh").read_text() == text and "--partition=p1" in text
    assert json.loads((folder / "slurm" / "submissions.json").read_text())[0]["shards"] == [0, 1]
    assert campaign.read_campaign(folder)["shards"] == 2


def test_submitting_again_runs_only_what_is_missing(fake, tmp_path):
    queue, path, b = fake
    assert submit(str(path), "--slurm", "--shards", "2").exit_code == 0
    folder = tmp_path / "results" / "grid"
    record = campaign.read_campaign(folder)
    from netbench.model import design

    runs = design.expand(b, b.seed)
    for entry in record["runs"]:  # shard 0 finished; shard 1 recorded one run and was cancelled
        if entry["shard"] == 0:
            cf.record_run(folder, record, runs, entry["run_id"])
    first_of_1 = next(e["run_id"] for e in record["runs"] if e["shard"] == 1)
    cf.record_run(folder, record, runs, first_of_1)
    result = submit(str(path), "--slurm", "--shards", "2")
    assert result.exit_code == 0, result.output
    assert queue.asked[-1] == ["100"]  # the earlier job was asked about
    assert "shard(s) 0: every run recorded; not submitted again" in result.stdout
    assert "--array=1\n" in queue.scripts[-1][1] and "submitted job 101: array task(s) 1 of 2" in result.stdout
    # while job 101 still has shard 1 queued, a third submission adds nothing
    queue.queued = {"101": {1}}
    result = submit(str(path), "--slurm", "--shards", "2")
    assert result.exit_code == 0 and len(queue.scripts) == 2
    assert "shard 1: still pending or running as job 101_1; not submitted again" in result.stdout
    # once every run is recorded there is nothing to submit
    queue.queued = {}
    for entry in record["runs"]:
        if entry["shard"] == 1:
            cf.record_run(folder, record, runs, entry["run_id"])
    result = submit(str(path), "--slurm", "--shards", "2")
    assert result.exit_code == 0 and len(queue.scripts) == 2
    assert "nothing left to run: 'netbench report results/grid'" in result.stdout


def test_another_shard_count_on_the_same_folder_is_refused(fake, tmp_path):
    queue, path, _ = fake
    assert submit(str(path), "--slurm", "--shards", "2").exit_code == 0
    result = submit(str(path), "--slurm", "--shards", "3")
    assert result.exit_code == 2 and "a campaign of 2 shards, not 3" in result.stderr
    assert len(queue.scripts) == 1


def test_an_sbatch_refusal_leaves_nothing_it_made(fake, tmp_path):
    queue, path, _ = fake
    queue.refuse = "invalid partition specified: nope"
    result = submit(str(path), "--slurm", "--shards", "2", "--partition", "nope")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0].startswith("error: sbatch refused ") and "invalid partition" in result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("args, words", [
    (["--shards", "2"], "name the cluster manager: --slurm"),
    (["--slurm", "--shards", "2", "--time", "soon"], "--time 'soon'"),
    (["--slurm", "--shards", "9"], "9 shards for a design of 8 runs: give at most 8"),
    (["--slurm", "--shards", "2", "--sbatch-arg", "--array=1"], "sets the array")])
def test_bad_flags_are_one_line_before_anything_is_written(fake, tmp_path, args, words):
    _, path, _ = fake
    result = submit(str(path), *args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr.splitlines()[0]
    assert not (tmp_path / "results").exists()


def test_active_tasks_are_this_users_jobs_among_ours(monkeypatch):
    import subprocess

    asked = []

    def fake_run(argv, **kwargs):
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, "12_1 R\n12_[2-3] PD\n40_0 R\n", "")

    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm.proc, "run", fake_run)
    assert slurm.SlurmCluster().active(["12", "7"]) == {"12": {1, 2, 3}}  # job 40 is another campaign's
    assert any(a.startswith("--user=") for a in asked[0]) and not any(a.startswith("--jobs") for a in asked[0])
    assert slurm.SlurmCluster().active([]) == {} and len(asked) == 1
