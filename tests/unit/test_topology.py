"""netbench.model.topology: subnet choice and naming."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyroute2.netlink.exceptions import NetlinkError

from netbench.errors import PrivilegeError
from netbench.model import topology as topo


def net(text):
    return ipaddress.ip_network(text)


def test_first_candidate_when_nothing_is_taken():
    assert topo.choose_subnet([]) == net("10.213.0.0/24")


@pytest.mark.parametrize("routes, expected", [
    (["10.213.0.0/24"], "10.213.1.0/24"),
    (["10.213.0.77/32"], "10.213.1.0/24"),
    (["10.213.0.1"], "10.213.1.0/24"),
    (["10.213.0.5/24"], "10.213.1.0/24"),  # host bits set, as `ip route` may show
    (["10.213.0.0/23", "10.213.2.0/24"], "10.213.3.0/24"),
    (["10.0.0.0/8"], "172.30.0.0/24"),
    (["10.0.0.0/8", "172.16.0.0/12"], "192.168.213.0/24"),
    (["0.0.0.0/0"], "10.213.0.0/24"),  # a default route overlaps everything and is ignored
    (["fd00::/8", "::/0"], "10.213.0.0/24"),  # IPv6 is ignored
    (["not a route", "10.213.0.0/24"], "10.213.1.0/24"),
    (["192.168.1.0/24", "172.30.0.0/24"], "10.213.0.0/24"),
])
def test_choose_subnet_avoids_routes(routes, expected):
    assert topo.choose_subnet(routes) == net(expected)


def test_no_free_subnet():
    with pytest.raises(ValueError, match="no free"):
        topo.choose_subnet(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"])


@given(st.lists(st.tuples(st.sampled_from(["10.213", "172.30"]), st.integers(0, 255), st.integers(16, 32)),
                max_size=30))
def test_chosen_subnet_overlaps_no_route(specs):
    routes = [str(ipaddress.ip_network(f"{prefix}.{third}.0/{length}", strict=False)) for prefix, third, length in specs]
    chosen = topo.choose_subnet(routes)  # 192.168.213.0/24 is never taken here
    assert chosen.prefixlen == 24
    assert not any(chosen.overlaps(ipaddress.ip_network(r)) for r in routes)


def test_plan_topology_names_and_addresses():
    t = topo.plan_topology(3, net("10.213.4.0/24"))
    assert t.subnet == "10.213.4.0/24"
    assert [n.name for n in t.nodes] == ["n1", "n2", "n3"]
    assert [n.netns for n in t.nodes] == ["netbench-n1", "netbench-n2", "netbench-n3"]
    assert [n.address for n in t.nodes] == ["10.213.4.1", "10.213.4.2", "10.213.4.3"]
    assert {n.ifname for n in t.nodes} == {"eth0"}
    assert {n.prefixlen for n in t.nodes} == {24}
    assert [n.port for n in t.nodes] == ["nb-n1", "nb-n2", "nb-n3"]
    assert all(topo.is_netbench_netns(n.netns) for n in t.nodes)
    assert all(len(n.port) <= 15 for n in topo.plan_topology(64, net("10.213.4.0/24")).nodes)  # IFNAMSIZ


@pytest.mark.parametrize("count", [0, -1, topo.MAX_NODES + 1])
def test_plan_topology_bounds(count):
    with pytest.raises(ValueError):
        topo.plan_topology(count, net("10.213.0.0/24"))


def test_max_nodes_have_distinct_addresses():
    t = topo.plan_topology(topo.MAX_NODES, net("10.213.0.0/24"))
    assert len({n.address for n in t.nodes}) == topo.MAX_NODES
    assert t.nodes[-1].name == f"n{topo.MAX_NODES}"


def test_node_lookup_and_json():
    t = topo.plan_topology(2, net("10.213.0.0/24"))
    assert t.node("n2").address == "10.213.0.2"
    assert t.node("netbench-n1").name == "n1"
    assert t.node("n3") is None
    data = t.to_json()
    assert data["subnet"] == "10.213.0.0/24" and data["switch"] == topo.SWITCH_NETNS
    assert data["nodes"][1] == {"name": "n2", "netns": "netbench-n2", "ifname": "eth0",
                                "address": "10.213.0.2", "prefixlen": 24}


def test_is_netbench_netns():
    assert topo.is_netbench_netns("netbench-sw")
    assert not topo.is_netbench_netns("docker-1")
    assert not topo.is_netbench_netns("my-netbench-n1")


@pytest.mark.parametrize("name", ["netbench-something", "netbench-sw2", "netbench-n0", "netbench-n01",
                                  f"netbench-n{topo.MAX_NODES + 1}", "netbench-n1-old", "netbench-doctor-42",
                                  "netbench-probe", "netbench-", "nbscratch-doctor-42-7"])
def test_only_the_names_netbench_gives_are_its_own(name):
    """Reset removes these namespaces and stops their processes: a user's netbench-* is not one."""
    assert not topo.is_netbench_netns(name)


def test_every_planned_namespace_is_recognised():
    plan = topo.plan_topology(topo.MAX_NODES, net("10.213.0.0/24"))
    assert all(topo.is_netbench_netns(node.netns) for node in plan.nodes)
    assert topo.is_netbench_netns(plan.switch_netns)


def test_scratch_names_carry_their_maker():
    name = topo.scratch_netns("doctor", 4242, 987654)
    assert name.startswith(topo.SCRATCH_PREFIX) and not topo.is_netbench_netns(name)
    assert topo.scratch_owner(name) == (4242, 987654)
    assert topo.scratch_owner("nbscratch-doctor-4242") is None
    assert topo.scratch_owner("netbench-doctor-4242") is None


# ---------------------------------------------------------------- local.up on a fake kernel


class _FakeNetns:
    def __init__(self):
        self.names: set[str] = set()

    def create(self, name):
        if name in self.names:
            raise FileExistsError(17, "File exists", name)
        self.names.add(name)

    def remove(self, name):
        self.names.remove(name)

    def listnetns(self):
        return sorted(self.names)


def _fake_netns_class(fail_on_port: str, failure: BaseException):
    class FakeNetNS:
        def __init__(self, name, flags=None):
            self.name = name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def link_lookup(self, ifname):
            return [1]

        def link(self, command, **kwargs):
            if command == "add" and kwargs.get("ifname") == fail_on_port:
                raise failure

        def addr(self, *args, **kwargs):
            pass

    return FakeNetNS


@pytest.mark.parametrize("fail_on_port", ["nb-n1", "nb-n3"])
@pytest.mark.parametrize("failure, raised", [
    (NetlinkError(1, "Operation not permitted"), PrivilegeError), (KeyboardInterrupt(), KeyboardInterrupt)])
def test_a_testbed_that_fails_halfway_is_taken_down(tmp_path, monkeypatch, fail_on_port, failure, raised):
    """`up` failing (or interrupted) at a node left the switch and the nodes before it behind."""
    from netbench import proc
    from netbench.state.journal import Journal
    from netbench.testbed import netns as local

    kernel = _FakeNetns()
    monkeypatch.setattr(local, "netns", kernel)
    monkeypatch.setattr(local, "NetNS", _fake_netns_class(fail_on_port, failure))
    monkeypatch.setattr(local, "host_networks", lambda: [])
    # the fake namespaces exist nowhere: never look for (or stop) processes in real ones
    monkeypatch.setattr(proc, "is_host_netns", lambda name: False)
    monkeypatch.setattr(proc, "pids_in_netns", lambda name: [])
    journal = Journal(tmp_path / "state")
    with pytest.raises(raised):
        local.up(3, journal)
    assert kernel.names == set()
    assert journal.pending() == []
