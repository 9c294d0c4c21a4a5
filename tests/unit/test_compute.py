"""Compute capacity per node: parsing, crossing, the quota plan, the cgroup adapters against a
folder of files, the journal and reset's undo, the embedded testbed's NodeCapacity with fakes."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from netbench.emulation import cgroups as cg
from netbench.errors import UsageError
from netbench.model import compute as cm
from netbench.model.design import sweep_runs
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.model.run import computes
from netbench.state.journal import Journal
from netbench.state.reset import reset
from netbench.testbed.compute import NodeCapacity
from tests.fakes.cgroups import FakeCgroups


# ---------------------------------------------------------------- parsing and crossing

def test_cpus_flag_parses_levels_per_node_and_every_node_without_one():
    (n2,) = cm.parse_flag(["n2=1,0.5,0.25"], "cpus", "--cpus")
    assert n2 == cm.ComputeFactor("cpus", "n2", (1.0, 0.5, 0.25))
    (every,) = cm.parse_flag(["0.5"], "cpus", "--cpus")
    assert every.node == cm.ALL and every.levels == (0.5,)
    (lifted,) = cm.parse_flag(["n3=max,0.2"], "cpus", "--cpus")
    assert lifted.levels == (None, 0.2)


def test_step_delay_flag_takes_the_last_levels_unit():
    (factor,) = cm.parse_flag(["n2=0,10,40ms"], "step_delay", "--step-delay")
    assert factor.levels == (0.0, 0.01, 0.04)


@pytest.mark.parametrize("text, message", [
    ("x=0.5", "not a node name"), ("n2=", "empty level"), ("n2=0.5,abc", "not a number of CPUs"),
    ("n2=0", "at least"), ("n2=0.5,0.5", "repeated level"), ("n2=-1", "at least")])
def test_bad_cpus_levels_name_the_flag(text, message):
    with pytest.raises(UsageError) as err:
        cm.parse_flag([text], "cpus", "--cpus")
    assert err.value.message.startswith("flag --cpus:") and message in err.value.message


def test_a_node_given_twice_is_refused():
    with pytest.raises(UsageError, match="given twice"):
        cm.parse_flag(["n2=1", "n2=0.5"], "cpus", "--cpus")


def test_factors_cross_first_outermost_and_name_their_points():
    factors = cm.parse_flag(["n2=max,0.5"], "cpus", "--cpus") + cm.parse_flag(["n2=0,40ms"], "step_delay", "--step-delay")
    points = cm.compute_points(factors)
    assert [p.suffix() for p in points] == ["", "n2s40ms", "n2c0.5", "n2c0.5-n2s40ms"]
    assert points[3].cpus_of("n2") == 0.5 and points[3].cpus_of("n1") is None and points[3].delay_of("n2") == 0.04
    assert points[3].columns() == {"cpus_n2": 0.5, "step_delay_s_n2": 0.04}
    assert cm.compute_points(()) == (cm.NONE,)


def test_every_node_applies_where_a_node_is_not_named():
    c = cm.NONE.set(cm.ALL, cpus=0.5).set("n2", cpus=0.25)
    assert c.cpus_of("n1") == 0.5 and c.cpus_of("n2") == 0.25 and c.columns() == {"cpus_all": 0.5, "cpus_n2": 0.25}


def test_sweep_runs_cross_the_network_with_the_node_capacities():
    computes_ = cm.compute_points(cm.parse_flag(["n2=max,0.2"], "cpus", "--cpus"))
    runs = sweep_runs([Profile(name="d1ms", delay_us=1000), Profile(name="d10ms", delay_us=10000)], 1, JobSpec(), 2,
                      computes=computes_)
    assert [(r.profile.name, r.compute.cpus_of("n2")) for r in runs] == [
        ("d1ms", None), ("d1ms+n2c0.2", 0.2), ("d10ms", None), ("d10ms+n2c0.2", 0.2)]
    assert [r.point for r in runs] == [0, 1, 2, 3]


def test_a_limit_above_the_cores_is_refused_with_a_hint():
    with pytest.raises(UsageError) as err:
        cm.check_cores(cm.NONE.set("n2", cpus=4.0), 2, "flag --cpus")
    assert "n2 at 4 CPUs" in err.value.message and "at most 2" in err.value.hint
    cm.check_cores(cm.NONE.set("n2", cpus=2.0), 2, "flag --cpus")


def test_a_topology_files_compute_section():
    c = cm.from_mapping({"n2": {"cpus": 0.5, "step_delay": "40ms"}}, "world.yaml: compute")
    assert c.cpus_of("n2") == 0.5 and c.delay_of("n2") == 0.04
    with pytest.raises(UsageError, match="world.yaml: compute: n2: takes cpus and step_delay"):
        cm.from_mapping({"n2": {"cpu": 1}}, "world.yaml: compute")


# ---------------------------------------------------------------- the quota plan

def test_quota_plan_in_microseconds_at_the_chosen_period():
    assert cm.quota_plan(0.25) == cm.Quota(2_500, cm.PERIOD_US)
    assert cm.quota_plan(1.5).cpu_max() == f"15000 {cm.PERIOD_US}"
    assert cm.quota_plan(None).cpu_max() == f"max {cm.PERIOD_US}"


def test_a_share_under_the_kernels_quota_floor_gets_a_longer_period():
    quota = cm.quota_plan(0.05)
    assert quota.quota_us >= cm.MIN_QUOTA_US and quota.quota_us / quota.period_us == pytest.approx(0.05)


# ---------------------------------------------------------------- the adapters, on a folder of files

def test_v1_writes_period_then_quota_and_lifts_it_with_minus_one(tmp_path):
    groups = cg.V1Cgroups(tmp_path)
    path = groups.create("netbench-n2")
    assert path == tmp_path / "netbench" / "netbench-n2" and path.is_dir()
    groups.set_quota("netbench-n2", cm.quota_plan(0.5))
    assert (path / "cpu.cfs_period_us").read_text() == "10000" and (path / "cpu.cfs_quota_us").read_text() == "5000"
    groups.set_quota("netbench-n2", cm.quota_plan(None))
    assert (path / "cpu.cfs_quota_us").read_text() == "-1"
    groups.add("netbench-n2", 1234)
    assert (path / "cgroup.procs").read_text() == "1234"


def test_v2_enables_the_cpu_controller_and_writes_cpu_max(tmp_path):
    (tmp_path / "cgroup.subtree_control").write_text("memory")
    groups = cg.V2Cgroups(tmp_path)
    path = groups.create("netbench-n2")
    assert path == tmp_path / "netbench.slice" / "netbench-n2"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "netbench.slice" / "cgroup.subtree_control").read_text() == "+cpu"
    groups.set_quota("netbench-n2", cm.quota_plan(0.25))
    assert (path / "cpu.max").read_text() == "2500 10000"
    (path / "cpu.stat").write_text("usage_usec 10\nnr_periods 7\nnr_throttled 3\nthrottled_usec 900\n")
    assert groups.throttled("netbench-n2") == {"nr_periods": 7, "nr_throttled": 3, "throttled_us": 900}


def test_remove_takes_the_group_and_its_empty_parent(tmp_path):
    groups = cg.V1Cgroups(tmp_path)  # (a plain folder: v2's parent keeps its subtree_control file)
    groups.create("a")
    groups.create("b")
    assert groups.remove("a") and (tmp_path / "netbench").is_dir()  # b is still in it
    assert groups.remove("b") and not (tmp_path / "netbench").exists()
    assert groups.remove("b") is False


def test_detect_prefers_v2_with_the_cpu_controller_else_v1(tmp_path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("memory pids")
    mounts = (f"cgroup2 {v2} cgroup2 rw 0 0\ncgroup {tmp_path}/cpu cgroup rw,relatime,cpu 0 0\n"
              f"cgroup {tmp_path}/cpuset cgroup rw,cpuset 0 0\n")
    found = cg.detect(lambda: mounts)
    assert found.version == 1 and found.root == tmp_path / "cpu"  # this machine's shape: v2 without cpu
    (v2 / "cgroup.controllers").write_text("cpu memory pids")
    assert cg.detect(lambda: mounts).version == 2
    with pytest.raises(Exception, match="no cgroup hierarchy"):
        cg.detect(lambda: "proc /proc proc rw 0 0\n")


# ---------------------------------------------------------------- journal and reset

def test_a_group_is_journaled_before_it_is_made_and_reset_removes_it(tmp_path):
    journal = Journal(tmp_path / "state")
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    groups = cg.NodeGroups(journal, cg.V1Cgroups(sysfs))

    class Refuse(cg.V1Cgroups):
        def create(self, name):
            assert [e.kind for e in journal.pending()] == ["cgroup"]  # recorded first
            return super().create(name)

    groups.cgroups = Refuse(sysfs)
    groups.create("netbench-n2")
    assert (sysfs / "netbench" / "netbench-n2").is_dir()
    removed = reset(journal)  # as after a kill -9 of the controller
    assert any("cgroup" in line for line in removed) and not (sysfs / "netbench").exists()
    assert journal.pending() == []


def test_reset_leaves_a_journaled_path_outside_netbenchs_parents(tmp_path):
    journal = Journal(tmp_path / "state")
    other = tmp_path / "sys" / "someone" / "group"
    other.mkdir(parents=True)
    journal.record("cgroup", path=str(other), root=str(tmp_path / "sys"), version=1)
    warnings = []
    reset(journal, warn=warnings.append)
    assert other.is_dir() and any("left alone" in w for w in warnings)


# ---------------------------------------------------------------- the embedded testbed's part

@dataclasses.dataclass(frozen=True)
class _Node:
    name: str
    netns: str


class _Spawner:
    def __init__(self):
        self.cgroups, self.node_env = {}, {}


def test_node_capacity_groups_limited_nodes_and_sets_each_points_limits(tmp_path):
    fake = FakeCgroups()
    journal = Journal(tmp_path)
    points = cm.compute_points(cm.parse_flag(["n2=max,0.5"], "cpus", "--cpus") +
                               cm.parse_flag(["n1=0,40ms"], "step_delay", "--step-delay"))
    runs = sweep_runs([Profile(name="p")], 1, JobSpec(), 2, computes=points)
    capacity = NodeCapacity(journal, detect=lambda: fake, cores=lambda: 2)
    capacity.prepare(runs)
    spawner = _Spawner()
    capacity.start([_Node("n1", "netbench-n1"), _Node("n2", "netbench-n2")], spawner)
    assert list(fake.groups) == ["netbench-n2"] and set(spawner.cgroups) == {"n2"}  # n1 is never limited
    assert spawner.cgroups["n2"].endswith("netbench-n2/cgroup.procs")
    delay_file = Path(spawner.node_env["n1"]["NETBENCH_STEP_DELAY_FILE"])
    capacity.apply(runs[3].compute)  # n2 at 0.5, n1 +40 ms
    assert fake.groups["netbench-n2"]["quota"] == cm.quota_plan(0.5) and float(delay_file.read_text()) == 0.04
    capacity.apply(runs[0].compute)
    assert fake.groups["netbench-n2"]["quota"] == cm.quota_plan(None) and float(delay_file.read_text()) == 0
    assert capacity.finish(spawner) == [] and fake.groups == {} and not delay_file.exists()
    assert spawner.cgroups == {} and journal.pending() == []


def test_node_capacity_without_limits_touches_no_cgroup(tmp_path):
    def refuse():
        raise AssertionError("no cgroup was needed")

    capacity = NodeCapacity(Journal(tmp_path), detect=refuse)
    capacity.prepare(sweep_runs([Profile(name="p")], 1, JobSpec(), 2))
    spawner = _Spawner()
    capacity.start([_Node("n1", "netbench-n1")], spawner)
    assert spawner.cgroups == {} and spawner.node_env == {}


def test_node_capacity_refuses_a_limit_above_the_cores_before_making_anything(tmp_path):
    fake = FakeCgroups()
    runs = sweep_runs([Profile(name="p")], 1, JobSpec(), 2, computes=(cm.NONE.set("n2", cpus=3.0),))
    with pytest.raises(UsageError, match="n2 at 3 CPUs"):
        NodeCapacity(Journal(tmp_path), detect=lambda: fake, cores=lambda: 2).prepare(runs)
    assert fake.calls == []


# ---------------------------------------------------------------- the step model

def test_slowdown_is_the_share_below_what_the_node_used():
    assert cm.slowdown(None) == 1.0 and cm.slowdown(2.0) == 1.0 and cm.slowdown(0.25) == 4.0
    assert cm.slowdown(0.5, busy_cpus=2.0) == 4.0 and cm.slowdown(0.01) == cm.MAX_SLOWDOWN


def test_worker_terms_follow_the_placement_of_workers_on_n1_n2():
    c = cm.NONE.set("n2", cpus=0.2).set("n1", step_delay_s=0.04)
    assert cm.worker_terms(c, 2) == ((1.0, 5.0), (0.04, 0.0))
    assert cm.worker_terms(cm.NONE.set("n3", cpus=0.2), 2) == ((), ())  # n3 holds no worker (a server)


def test_a_synchronous_step_is_bound_by_the_slowest_node():
    from netbench.model import step_model

    x = step_model.StepInputs(strategy="allreduce", workers=2, model_bytes=4_000_000, compute_s=0.01, delay_s=0.001,
                              rate_bps=None, overhead_s=0.002, beta_s_per_byte=1e-9)
    equal = step_model.predict(x)
    slow = step_model.predict(dataclasses.replace(x, node_slowdown=(1.0, 5.0), node_delay_s=(0.0, 0.0)))
    delayed = step_model.predict(dataclasses.replace(x, node_slowdown=(1.0, 1.0), node_delay_s=(0.0, 0.04)))
    # its CPU work (10 ms of compute, 4 ms moving 4 MB at the unshaped per-byte cost) takes 5x as long
    assert slow.compute_s == pytest.approx(5 * 0.014 - 0.004) and slow.step_s == pytest.approx(equal.step_s + 4 * 0.014)
    assert delayed.step_s == pytest.approx(equal.step_s + 0.04)
    gossip = step_model.node_compute_s(dataclasses.replace(x, strategy="gosgd", node_slowdown=(1.0, 5.0)), 0.01)
    assert gossip == pytest.approx(0.01)  # workers at their own pace: the chief's own (worker 0, unlimited)
    ssp = step_model.node_compute_s(dataclasses.replace(x, strategy="ps-ssp", node_slowdown=(1.0, 5.0)), 0.01)
    assert ssp == pytest.approx(0.05)  # the staleness gate holds the chief within S steps of the slowest


def test_ps_sync_with_backup_workers_waits_for_the_round_s_last_gradient_not_the_slowest():
    from netbench.model import step_model

    x = step_model.StepInputs(strategy="ps-sync", workers=3, model_bytes=0, compute_s=0.01, delay_s=0.001,
                              rate_bps=None, overhead_s=0.002, beta_s_per_byte=0.0,
                              node_slowdown=(1.0, 2.0, 5.0), node_delay_s=(0.0, 0.0, 0.0))
    assert step_model.node_compute_s(x, 0.01) == pytest.approx(0.05)  # every gradient: the slowest's
    backup = dataclasses.replace(x, backup_workers=1)
    assert step_model.node_compute_s(backup, 0.01) == pytest.approx(0.02)  # the first two: n2's
    assert step_model.node_compute_s(dataclasses.replace(x, backup_workers=2), 0.01) == pytest.approx(0.01)


# ---------------------------------------------------------------- playbooks

def test_a_playbooks_cpus_factor_crosses_per_node_levels(tmp_path):
    from netbench.model.design import expand
    from netbench.model.playbook import playbook_from_mapping

    book = playbook_from_mapping({"name": "unequal", "factors": {"latency": ["1ms"], "cpus": {"n2": [1, 0.5]},
                                                                 "step_delay": {"n1": ["0ms", "40ms"]}},
                                  "steps": 5, "order": "as-written"}, "unequal.yaml")
    runs = expand(book, seed=0)
    assert [(r.compute.cpus_of("n2"), r.compute.delay_of("n1")) for r in runs] == [
        (1.0, 0.0), (1.0, 0.04), (0.5, 0.0), (0.5, 0.04)]
    assert runs[3].profile.name == "d1ms+n2c0.5-n1s40ms" and runs[3].settings.compute == runs[3].compute
    with pytest.raises(UsageError, match=r"unequal.yaml: factors.cpus.n2: 'x' is not a number of CPUs"):
        playbook_from_mapping({"factors": {"cpus": {"n2": ["x"]}}}, "unequal.yaml")
    with pytest.raises(UsageError, match="must map nodes to their levels"):
        playbook_from_mapping({"factors": {"cpus": [0.5]}}, "unequal.yaml")


def test_a_playbooks_fixed_and_extra_runs_take_one_limit_per_node_and_the_dry_run_shows_them(tmp_path):
    """The reference's promise: per-node cpus and step_delay under fixed: and in an extra run too
    (one level each), and a dry run's table has a column per node key (it raised KeyError)."""
    import subprocess
    import sys

    from netbench.model.design import expand
    from netbench.model.playbook import playbook_from_mapping

    data = {"name": "unequal", "factors": {"latency": ["1ms", "10ms"]},
            "fixed": {"strategy": "ps-async", "workers": 2, "cpus": {"n2": 0.5}},
            "extra_runs": [{"latency": "1ms", "cpus": {"n2": "max"}, "step_delay": {"n1": "20ms"}}],
            "steps": 5, "order": "as-written"}
    runs = expand(playbook_from_mapping(data, "unequal.yaml"), seed=0)
    assert [(r.settings.delay_us, r.compute.cpus_of("n2"), r.compute.delay_of("n1")) for r in runs] == [
        (1000, 0.5, 0.0), (10000, 0.5, 0.0), (1000, None, 0.02)]
    for fixed, message in (({"cpus": {"n2": [0.5]}}, "fixed.cpus.n2: takes one level"),
                           ({"cpus": 0.5}, "fixed.cpus: must map nodes to one level each"),
                           ({"step_delay": {"n2": "x"}}, "fixed.step_delay.n2")):
        with pytest.raises(UsageError, match=f"unequal.yaml: {message}"):
            playbook_from_mapping({**data, "fixed": fixed}, "unequal.yaml")
    with pytest.raises(UsageError, match="unequal.yaml: fixed.cpus.n2: is also a factor"):
        playbook_from_mapping({**data, "factors": {"cpus": {"n2": [1, 0.5]}}}, "unequal.yaml")
    import yaml

    book = tmp_path / "unequal.yaml"
    book.write_text(yaml.safe_dump({**data, "factors": {"latency": ["1ms"], "cpus": {"n3": [1, 0.25]}},
                                    "fixed": {"strategy": "ps-async", "workers": 2}}))
    shown = subprocess.run([sys.executable, "-m", "netbench.cli", "run", str(book), "--dry-run"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    header = next(line for line in shown.stdout.splitlines() if line.split()[:2] == ["run", "point"])
    assert header.split()[3:7] == ["cpus.n3", "latency", "cpus.n2", "step_delay.n1"], shown.stdout
    rows = [line.split() for line in shown.stdout.splitlines() if line.split()[:1] in (["r000"], ["r001"], ["r002"], ["r003"])]
    assert sorted((row[3], row[5], row[6]) for row in rows) == [  # the extra run crosses the factor cpus.n3
        ("0.25", "max", "0ms"), ("0.25", "max", "20ms"), ("1", "max", "0ms"), ("1", "max", "20ms")], shown.stdout


def test_a_topology_files_compute_limits_its_runs_nodes():
    from netbench.model.design import topology_design
    from netbench.model.pairs_file import pair_topology_from_mapping

    data = {"name": "two", "matrix": {"n1": {"n2": {"delay": "5ms"}}, "n2": {"n1": {"delay": "5ms"}}},
            "compute": {"n2": {"cpus": 0.5}}}
    pairs = pair_topology_from_mapping(data, "two.yaml")
    (run,) = topology_design(pairs, (1.0,), 1, JobSpec(), 2).runs()
    assert run.compute.cpus_of("n2") == 0.5 and run.profile.name == "two+n2c0.5"
    with pytest.raises(UsageError, match="two.yaml: compute.n3: is not a node of the topology"):
        pair_topology_from_mapping({**data, "compute": {"n3": {"cpus": 0.5}}}, "two.yaml")


# ---------------------------------------------------------------- a host's agent (netbench node task --cpus)

def test_a_hosts_task_starts_in_a_limited_group_journaled_and_removed_after(tmp_path):
    import io
    import subprocess
    import sys

    from netbench.remote.agent import run_task

    class Folder(FakeCgroups):  # in memory, with a real cgroup.procs file for the child to join
        def create(self, name):
            path = super().create(name)
            path.mkdir(parents=True, exist_ok=True)
            return path

    fake = Folder(str(tmp_path / "sys"))
    journal = Journal(tmp_path / "state")
    seen = {}

    def watching_spawn(*args, **kwargs):
        seen["kinds"] = [e.kind for e in journal.pending()]  # the group is journaled before the task starts
        seen["cgroup"] = kwargs.get("cgroup")
        return real_spawn(*args, **kwargs)

    from netbench import proc as proc_module

    real_spawn = proc_module.spawn
    import threading

    read, write = os.pipe()
    out = io.BytesIO()
    procs = tmp_path / "sys" / "netbench.slice" / f"netbench-task-worker0-{os.getpid()}" / "cgroup.procs"
    try:
        proc_module.spawn = watching_spawn
        task = threading.Thread(target=lambda: run_task(
            journal, [sys.executable, "-c", "import time; time.sleep(30)"], {}, "worker0", grace=0.5,
            stdin=os.fdopen(read, "rb"), stdout=out, cpus=0.5, cgroups=fake))
        task.start()
        deadline = time.monotonic() + 20
        while not (procs.exists() and procs.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.close(write)  # the controller closes the channel: the task is stopped
        task.join(timeout=20)
    finally:
        proc_module.spawn = real_spawn
    pid = int(out.getvalue().split(b"pid=")[1].split()[0])
    assert seen["kinds"] == ["cgroup"] and seen["cgroup"].endswith("/cgroup.procs")
    assert Path(seen["cgroup"]).read_text().strip() == str(pid)  # the task joined before it ran
    assert ("quota", f"netbench-task-worker0-{os.getpid()}", "5000 10000") in fake.calls
    assert fake.groups == {} and journal.pending() == []  # removed after, nothing left for reset
