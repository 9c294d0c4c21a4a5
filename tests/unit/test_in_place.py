"""A change to a live link changes it in place: planned against what the journal says netbench
holds (emulation/held.py), never clearing first, so the link is never unshaped."""

from __future__ import annotations

import ipaddress

import pytest
from tests.fakes.netlink import make_fakes

from netbench.emulation import backends, changes as ch
from netbench.emulation.executor import Executor
from netbench.emulation.held import Held, held_from_entries
from netbench.model.profile import Profile
from netbench.model.topology import plan_topology
from netbench.state.journal import Journal
from netbench.testbed.embedded import EmbeddedTestbed

TOPO = plan_topology(2, ipaddress.ip_network("10.213.0.0/24"))
LAT10 = Profile(name="d10", delay_us=10_000, rate_bps=100_000_000)
LAT20 = Profile(name="d20", delay_us=20_000, rate_bps=200_000_000)
RATE = Profile(name="r", rate_bps=100_000_000)
NONE = Profile(name="none")


@pytest.fixture
def ex(tmp_path):
    qdiscs, iptables, engines, log = make_fakes()
    return Executor(journal=Journal(tmp_path / "state"), qdiscs=qdiscs, iptables=iptables, engines=engines)


def apply(ex, profile, backend="userspace", seed=0):
    plan = backends.plan_apply(profile, TOPO, backend, seed=seed, held=ex.held())
    ex.qdiscs.calls.clear(), ex.iptables.calls.clear(), ex.engines.calls.clear()
    ex.apply(plan)
    return plan


def pids(ex):
    return {key: engine["pid"] for key, engine in ex.engines.running.items()}


def test_a_first_apply_creates_and_clears_nothing(ex):
    plan = apply(ex, LAT10)
    assert not any(isinstance(c, (ch.ClearRules, ch.ClearQdisc, ch.ClearIngress, ch.StopEngine)) for c in plan)
    assert [type(c).__name__ for c in plan] == ["SetTbf", "SetTbf", "StartEngine", "StartEngine",
                                                "AddNfqueueRule", "AddNfqueueRule"]


def test_a_delay_and_rate_change_is_made_in_place(ex):
    apply(ex, LAT10)
    before = pids(ex)
    apply(ex, LAT20, seed=5)
    # no qdisc deleted, no rule flushed or added, no engine stopped or started: reconfigured
    assert ex.qdiscs.methods() == ["replace_tbf", "replace_tbf"]
    assert ex.iptables.methods() == []
    assert ex.engines.methods() == ["reconfigure", "reconfigure"]
    assert pids(ex) == before
    for position, node in enumerate(TOPO.nodes):
        assert ex.qdiscs.read(node.netns, node.ifname)["rate_bps"] == 200_000_000
        params = ex.engines.read(TOPO.switch_netns, position + 1)["params"]
        assert (params["delay_us"], params["seed"]) == (20_000, 5 + position)
    assert len(ex.iptables.rules(TOPO.switch_netns)) == 2


def test_many_live_changes_keep_one_journal_entry_per_thing(ex):
    apply(ex, LAT10)
    entries = sorted((e.kind, e.data.get("netns")) for e in ex.journal.pending())
    for _ in range(5):
        apply(ex, LAT20)
        apply(ex, LAT10)
    assert sorted((e.kind, e.data.get("netns")) for e in ex.journal.pending()) == entries
    assert len(ex.journal.path.read_text().splitlines()) == len(entries)  # nothing written by a change


def test_dropping_the_delay_removes_each_rule_before_its_engine(ex):
    apply(ex, LAT10)
    log = []
    ex.iptables.log = ex.engines.log = log
    apply(ex, RATE)
    assert [(a, m) for a, m, _ in log] == [("iptables", "delete_rule"), ("iptables", "delete_rule"),
                                          ("engines", "stop"), ("engines", "stop")]
    assert ex.iptables.rules(TOPO.switch_netns) == [] and ex.engines.running == {}
    assert ex.qdiscs.methods() == ["replace_tbf", "replace_tbf"]  # the tbf kept, changed in place
    assert not any(e.kind in ("iptables", "process") for e in ex.journal.pending())


def test_dropping_the_rate_removes_only_the_tbf(ex):
    apply(ex, LAT10)
    apply(ex, Profile(name="d", delay_us=10_000))
    assert ex.qdiscs.methods() == ["clear", "clear"]
    assert ex.engines.methods() == ["reconfigure", "reconfigure"]
    for node in TOPO.nodes:
        assert ex.qdiscs.read(node.netns, node.ifname) is None


def test_a_profile_without_fields_clears_what_is_held_and_nothing_else(ex):
    apply(ex, RATE)
    plan = apply(ex, NONE)
    assert [type(c).__name__ for c in plan] == ["ClearQdisc", "ClearQdisc"]
    assert ex.journal.pending() == []


def test_an_engine_that_died_is_started_again(ex):
    apply(ex, LAT10)
    ex.engines.running.clear()  # died: the journal still says it runs
    apply(ex, LAT20)
    assert ex.engines.methods() == ["reconfigure", "reconfigure", "stop", "start", "stop", "start"]
    assert ex.engines.read(TOPO.switch_netns, 1)["params"]["delay_us"] == 20_000
    engines = [e for e in ex.journal.pending() if e.kind == "process"]
    assert len(engines) == 2  # the dead ones' entries done, the new ones' written


def test_netem_to_userspace_and_back_clears_the_other_backend(ex):
    apply(ex, LAT10, backend="netem")
    apply(ex, Profile(name="d", delay_us=5_000), backend="userspace")
    for node in TOPO.nodes:
        assert ex.qdiscs.read(node.netns, node.ifname) is None  # the netem root went
    assert len(ex.engines.running) == 2
    apply(ex, LAT10, backend="netem")
    assert ex.iptables.rules(TOPO.switch_netns) == [] and ex.engines.running == {}
    assert all(ex.qdiscs.read(n.netns, n.ifname)["kind"] == "netem" for n in TOPO.nodes)


def test_a_netem_change_is_live_and_clears_nothing(ex):
    apply(ex, LAT10, backend="netem")
    plan = apply(ex, LAT20, backend="netem")
    assert [type(c).__name__ for c in plan] == ["ShapeDevice", "ShapeDevice"]
    assert all(ex.qdiscs.read(n.netns, n.ifname)["live_change"] for n in TOPO.nodes)
    assert ex.iptables.methods() == []


def test_held_from_the_journal():
    class E:
        def __init__(self, kind, **data):
            self.kind, self.data = kind, data

    held = held_from_entries([E("qdisc", netns="a", ifname="eth0", qdisc_kind="tbf"),
                              E("ingress", netns="a", dev="eth0", ifb="nbifb-eth0"),
                              E("process", netns="sw", queue=1, role="engine"), E("process", pid=3, role="task"),
                              E("iptables", netns="sw", chain="NETBENCH", port="p1", queue=1)])
    assert held == Held(roots={("a", "eth0"): "tbf"}, ingress=frozenset({("a", "eth0")}),
                        engines=frozenset({("sw", 1)}), rules={"sw": frozenset({"p1"})})
    # a rule journaled without its port cannot be placed: plan from scratch
    old = held_from_entries([E("iptables", netns="sw", chain="NETBENCH")])
    assert not old.exact
    plan = backends.plan_apply(LAT10, TOPO, "userspace", held=old)
    assert isinstance(plan[0], ch.ClearRules)


def test_apply_plan_plans_again_when_the_journal_changed_since_planning(tmp_path):
    qdiscs, iptables, engines, _ = make_fakes()
    testbed = EmbeddedTestbed(Journal(tmp_path / "state"), adapters=(qdiscs, iptables, engines),
                              discover=lambda: TOPO, probe=lambda: (False, "no netem"))
    planned = testbed.plan(LAT10, "userspace")  # against nothing held: StartEngine
    other = testbed.plan(LAT10, "userspace")
    testbed.apply_plan(other)  # another command made the engines meanwhile
    engines.calls.clear()
    testbed.apply_plan(planned)  # starting them again would fail (the queue is bound)
    assert engines.methods() == ["reconfigure", "reconfigure"]
