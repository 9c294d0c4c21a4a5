"""netbench.model.shard: a design's runs shared among a campaign's shards (pure), and the
campaign record that keeps the share (experiment/campaign.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from netbench.experiment import campaign
from netbench.model import design
from netbench.model.playbook import playbook_from_mapping
from netbench.model.shard import POINTS, REPETITIONS, Shard, check_count, parse_shard, shard_runs, split

ROOT = Path(__file__).resolve().parents[2]


def book(**data):
    data.setdefault("fixed", {"model": "mlp", "workers": 2, "strategy": "allreduce"})
    return playbook_from_mapping(data, "pb.yaml", base_dir=ROOT / "playbooks")


def runs_of(b, seed=7):
    return design.expand(b, seed)


# ---------------------------------------------------------------- I/N

@pytest.mark.parametrize("text, shard", [("0/2", Shard(0, 2)), ("3/4", Shard(3, 4)), (" 0 / 1 ", Shard(0, 1))])
def test_a_shard_is_i_of_n_from_zero(text, shard):
    assert parse_shard(text) == shard and str(shard) == text.replace(" ", "")


@pytest.mark.parametrize("text, words", [("2/2", "0 to N-1"), ("1/0", "0 to N-1"), ("a/2", "not I/N"),
                                         ("1", "not I/N"), ("-1/2", "not I/N")])
def test_a_bad_shard_says_what_it_takes(text, words):
    with pytest.raises(ValueError, match=words):
        parse_shard(text)


def test_more_shards_than_runs_are_refused():
    check_count(4, 4)
    with pytest.raises(ValueError, match="give at most 4"):
        check_count(5, 4)
    with pytest.raises(ValueError, match="at least 1"):
        check_count(0, 4)


# ---------------------------------------------------------------- by repetitions

def test_whole_repetitions_make_each_shard_a_block_in_the_designs_order():
    b = book(factors={"latency": ["1ms", "10ms", "50ms"], "bandwidth": ["100mbit", "1gbit"]}, repeat=3,
             order="random", seed=5)
    runs = runs_of(b, 5)
    plan = split(runs, 2, b.repetitions)
    assert plan.by == REPETITIONS and plan.count == 2
    by_index = {r.index: r for r in runs}
    assert {by_index[i].repeat for i in plan.shards[0]} == {0, 2}
    assert {by_index[i].repeat for i in plan.shards[1]} == {1}
    for share in plan.shards:  # every point of each of its repetitions: a machine is a block
        reps = {by_index[i].repeat for i in share}
        assert sorted((by_index[i].point, by_index[i].repeat) for i in share) == \
            sorted(itertools.product(range(6), reps))
        assert list(share) == sorted(share)  # the design's (random) run order, kept
    assert sorted(itertools.chain(*plan.shards)) == list(range(len(runs)))  # each run exactly once
    assert not any(plan.is_extra(i) for i in itertools.chain(*plan.shards))


def test_the_share_is_a_pure_function_of_the_design():
    b = book(factors={"latency": ["1ms", "10ms"]}, repeat=4, order="random", seed=9)
    assert split(runs_of(b, 9), 3, 4) == split(runs_of(b, 9), 3, 4)
    assert split(runs_of(b, 9), 3, 4).shards != split(runs_of(b, 9), 2, 4).shards


# ---------------------------------------------------------------- by points

def test_fewer_repetitions_than_shards_share_points_by_time_and_add_the_reference():
    b = book(factors={"latency": ["1ms", "10ms", "50ms", "100ms"]}, repeat=1, order="as-written")
    runs = runs_of(b)
    seconds = {0: 10.0, 1: 40.0, 2: 30.0, 3: 20.0}
    plan = split(runs, 2, 1, seconds)
    assert plan.by == POINTS
    # longest first, each to the shard with least so far: 40 -> 0, 30 -> 1, 20 -> 1, 10 -> 0
    assert plan.shards == ((0, 1), (2, 3, 4))  # shard 1 lacks point 0: an extra run, index 4
    assert plan.is_extra(4) and not plan.is_extra(3) and plan.shard_of(4) == 1
    mine = shard_runs(runs, plan, 1)
    assert [r.run_id for r in mine] == ["r002", "r003", "r004"]
    extra = mine[-1]
    assert extra.point == 0 and extra.profile == runs[0].profile and extra.job == runs[0].job
    assert extra.repeat == 1 + 1  # after the design's repetitions, by shard
    # each shard measures the reference point
    for index in range(2):
        assert any(r.point == plan.reference_point for r in shard_runs(runs, plan, index))


def test_equal_times_fall_to_the_lower_shard_and_the_earlier_run():
    b = book(factors={"latency": ["1ms", "10ms", "50ms"]}, repeat=1, order="as-written")
    plan = split(runs_of(b), 3, 1)
    assert plan.shards == ((0,), (1, 3), (2, 4))


# ---------------------------------------------------------------- the campaign's record

def test_the_campaign_record_keeps_the_share_and_each_runs_estimate(tmp_path):
    b = book(factors={"latency": ["1ms", "50ms"]}, repeat=2, order="random", seed=3, steps=10, warmup=2)
    runs = runs_of(b, 3)
    record = campaign.plan(b, 3, runs, 2, created=0.0)
    assert record["by"] == REPETITIONS and record["shards"] == 2 and record["seed"] == 3
    assert record["digest"] == design.design_digest(b, runs)
    assert [e["run_id"] for e in record["runs"]] == [r.run_id for r in runs]
    assert all(e["estimate_s"] > 0 for e in record["runs"])
    # the 50 ms point is modelled slower than the 1 ms one
    slow = {e["point"]: e["estimate_s"] for e in record["runs"]}
    assert slow[1] > slow[0]
    assert campaign.split_of(record) == split(runs, 2, 2)
    first, wrote = campaign.create_once(tmp_path, record)
    again, wrote_again = campaign.create_once(tmp_path, {**record, "seed": 99})  # a second shard's: the first stays
    assert first == again and again["seed"] == 3 and (wrote, wrote_again) == (True, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["campaign.json"]


def test_a_campaign_of_another_design_or_count_is_refused(tmp_path):
    b = book(factors={"latency": ["1ms", "50ms"]}, repeat=2, order="random", seed=3)
    runs = runs_of(b, 3)
    record = campaign.plan(b, 3, runs, 2)
    campaign.check_matches(tmp_path, record, design.design_digest(b, runs), 2, "pb.yaml")
    with pytest.raises(campaign.CampaignError, match="another design"):
        campaign.check_matches(tmp_path, record, "0" * 16, 2, "pb.yaml")
    with pytest.raises(campaign.CampaignError, match="a campaign of 2 shards, not 3") as info:
        campaign.check_matches(tmp_path, record, record["digest"], 3, "pb.yaml")
    assert "I/2" in info.value.hint


def test_a_shard_folder_is_held_by_one_session(tmp_path):
    with campaign.ShardLock(tmp_path):
        with pytest.raises(campaign.CampaignError, match="being run already") as info:
            with campaign.ShardLock(tmp_path):
                pass
        assert "pid" in info.value.message
    with campaign.ShardLock(tmp_path):  # released
        pass


# ---------------------------------------------------------------- run --shard

@pytest.fixture
def smoke(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    return str(ROOT / "playbooks" / "smoke.yaml")


def run(*args):
    from click.testing import CliRunner

    from netbench.cli import app as cli

    return CliRunner().invoke(cli.main, ["run", *args])


def test_a_shards_dry_run_shows_its_share_and_writes_nothing(smoke, tmp_path):
    result = run(smoke, "--shard", "0/2", "--output", "c", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "shard 0/2 of the campaign in c: 2 runs in 2 shards, shared by points" in result.stdout
    assert "2 runs of the design's 2 (shard 0/2, 1 of them an extra run of the reference point)" in result.stdout
    assert not (tmp_path / "c").exists()


def test_a_shard_refused_before_it_runs_leaves_nothing(smoke, tmp_path, monkeypatch):
    from netbench.cli import common
    from netbench.errors import PrivilegeError

    def refused(use):  # as on a host without user namespaces for users: after the campaign was opened
        raise PrivilegeError("user namespaces are off for users (user.max_user_namespaces = 0)")

    monkeypatch.setattr(common, "require_testbed", refused)
    result = run(smoke, "--shard", "1/2", "--output", "deep/c")
    assert result.exit_code == 3, result.output
    assert "user namespaces are off" in result.stderr
    assert not (tmp_path / "deep").exists()


def test_a_campaign_and_a_plain_run_never_share_a_folder(smoke, tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "playbook.json").write_text("{}")
    result = run(smoke, "--shard", "0/2", "--output", "plain", "--dry-run")
    assert result.exit_code == 2 and "run on one machine, not a campaign" in result.stderr
    campaign.create_once(tmp_path / "c", {"runs": [], "shards": 2})
    result = run(smoke, "--output", "c", "--dry-run")
    assert result.exit_code == 2 and "a campaign folder: its shards run with --shard I/N" in result.stderr
    result = run(smoke, "--shard", "2/2", "--dry-run")
    assert result.exit_code == 2 and "I must be 0 to N-1" in result.stderr
    result = run(smoke, "--shard", "0/3", "--output", "d", "--dry-run")
    assert result.exit_code == 2 and "3 shards for a design of 2 runs: give at most 2" in result.stderr
