"""A host makes its controller's plan in place (emulation/in_place.py): the controller plans
without the host's journal, the host drops the clears that would unshape a live link."""

from __future__ import annotations

import pytest
from tests.fakes.netlink import make_fakes

from netbench.emulation import changes as ch
from netbench.emulation.executor import Executor
from netbench.emulation.held import NOTHING, Held, held_from_entries
from netbench.emulation.in_place import in_place
from netbench.model.profile import Profile
from netbench.remote.agent import bind_plan
from netbench.remote.controller import hosts_topology, plan_for_host
from netbench.remote.inventory import Host, Inventory
from netbench.state.journal import Journal

NS = "nbhost-1"
HOST = Host(name="h1", ssh="192.0.2.1", interface="eth1", tf_address="10.9.0.1")
INV = Inventory(path="hosts.yaml", hosts=(HOST,))
TOPO = hosts_topology(INV)
R10 = Profile(name="r10", rate_bps=10_000_000)
R20 = Profile(name="r20", rate_bps=20_000_000)
D10 = Profile(name="d10", delay_us=10_000)
D20 = Profile(name="d20", delay_us=20_000, rate_bps=50_000_000)
NONE = Profile(name="none")


def host_plan(profile, backend):
    return bind_plan(plan_for_host(profile, HOST, backend, TOPO), NS)


def names(plan):
    return [type(c).__name__ for c in plan]


def test_nothing_held_drops_every_clear():
    plan = host_plan(R10, "userspace")  # rateonly: ClearIngress, ClearQdisc, SetTbf
    assert names(plan) == ["ClearIngress", "ClearQdisc", "SetTbf"]
    assert names(in_place(plan, NOTHING)) == ["SetTbf"]
    assert in_place(host_plan(NONE, "userspace"), NOTHING) == []


def test_a_held_root_is_replaced_in_place_not_cleared_first():
    held = Held(roots={(NS, "eth1"): "tbf"})
    assert names(in_place(host_plan(R20, "userspace"), held)) == ["SetTbf"]
    held = Held(roots={(NS, "eth1"): "netem"})  # another kind: the adapter replaces it
    assert names(in_place(host_plan(D20, "netem"), held)) == ["ShapeDevice"]


def test_a_held_root_no_longer_wanted_is_cleared():
    held = Held(roots={(NS, "eth1"): "tbf"}, ingress=frozenset({(NS, "eth1")}))
    assert names(in_place(host_plan(NONE, "userspace"), held)) == ["ClearIngress", "ClearQdisc"]
    assert names(in_place(host_plan(NONE, "netem"), held)) == ["ClearQdisc", "ClearIngress"]


def test_a_clear_after_the_set_is_kept_and_other_devices_are_not_confused():
    held = Held(roots={(NS, "eth1"): "tbf", (NS, "eth2"): "tbf"})
    plan = [ch.SetTbf("h1", NS, "eth1", 1_000_000, 1514, 1514), ch.ClearQdisc("h1", NS, "eth1"),
            ch.ClearQdisc("h1", NS, "eth2"), ch.SetTbf("h1", "other", "eth2", 1_000_000, 1514, 1514)]
    assert in_place(plan, held) == plan  # the clear after the set stays; eth2 set in another namespace


def test_an_inexact_held_keeps_the_plan():
    plan = host_plan(R10, "userspace")
    assert in_place(plan, Held(exact=False)) == plan


@pytest.fixture
def ex(tmp_path):
    qdiscs, iptables, engines, _ = make_fakes()
    return Executor(journal=Journal(tmp_path / "state"), qdiscs=qdiscs, iptables=iptables, engines=engines)


@pytest.mark.parametrize("backend, first, second", [("userspace", R10, R20), ("netem", D10, D20)])
def test_changes_on_a_host_never_clear_the_live_root(ex, backend, first, second):
    for profile in (first, second, first, second):
        ex.apply(in_place(host_plan(profile, backend), held_from_entries(ex.journal.pending())))
    assert "clear" not in ex.qdiscs.methods() and "clear_ingress" not in ex.qdiscs.methods()
    assert len([e for e in ex.journal.pending() if e.kind == "qdisc"]) == 1
    ex.apply(in_place(host_plan(NONE, backend), held_from_entries(ex.journal.pending())))
    assert ex.journal.pending() == [] and ex.qdiscs.read(NS, "eth1") is None


def test_without_in_place_the_same_changes_clear_the_root_first(ex):
    """What the host did before: the controller's plan clears the live tbf before setting it."""
    for profile in (R10, R20):
        ex.apply(host_plan(profile, "userspace"))
    assert "clear" in ex.qdiscs.methods()
