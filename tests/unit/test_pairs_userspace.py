"""The userspace backend's per-pair plan (backends/userspace.py plan_pairs): each node's engine
gets its destinations' table, no tbf; a change is made in place (the running engines get the new
table through their control sockets); refusals name the pair; Engines sends the table."""

from __future__ import annotations

import ipaddress
import os

import pytest
from tests.fakes.netlink import make_fakes
from tests.unit.test_engine_control import journal, server  # noqa: F401 - fixtures

from netbench import proc
from netbench.emulation import backends, changes as ch
from netbench.emulation.backends import userspace
from netbench.emulation.delay_queue import DestParams, EngineParams
from netbench.emulation.engines import Engines
from netbench.emulation.executor import Executor
from netbench.errors import BackendUnavailable, UsageError
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import Profile, profile_from_mapping
from netbench.model.topology import plan_topology
from netbench.state.journal import Journal

TOPO = plan_topology(4, ipaddress.ip_network("10.213.0.0/24"))
GROUPS = {"n1": "us", "n2": "us", "n3": "eu", "n4": "eu"}


def two_regions(near: dict, far: dict, name: str = "two-regions") -> PairTopology:
    profiles = {True: profile_from_mapping(near, "test"), False: profile_from_mapping(far, "test")}
    links = tuple(PairLink(a, b, profiles[GROUPS[a] == GROUPS[b]]) for a in GROUPS for b in GROUPS if a != b)
    return PairTopology(name, tuple(GROUPS), links)


PAIRS = two_regions({"delay": "2ms"}, {"delay": "25ms", "rate": "1gbit", "loss": "0.1%"})
ADDRESS = {node.name: node.address for node in TOPO.nodes}


def test_each_node_gets_its_destinations_table_and_no_tbf():
    plan = userspace.plan_pairs(PAIRS, TOPO, TOPO.nodes, seed=7)
    assert not any(isinstance(c, ch.SetTbf) for c in plan)
    engines = [c for c in plan if isinstance(c, ch.StartEngine)]
    assert [(c.node, c.queue_num, c.seed) for c in engines] == [("n1", 1, 7), ("n2", 2, 8), ("n3", 3, 9), ("n4", 4, 10)]
    n1 = engines[0]
    assert (n1.delay_us, n1.jitter_us, n1.loss) == (0, 0, 0.0)  # other destinations pass unshaped
    assert n1.pairs == (DestParams(ADDRESS["n2"], 2_000),
                        DestParams(ADDRESS["n3"], 25_000, 0, 0.001, 1_000_000_000),
                        DestParams(ADDRESS["n4"], 25_000, 0, 0.001, 1_000_000_000))
    assert [c.port for c in plan if isinstance(c, ch.AddNfqueueRule)] == [n.port for n in TOPO.nodes]
    text = "\n".join(c.describe() for c in plan)
    assert f"to {ADDRESS['n3']}: delay 25ms jitter 0ms loss 0.1% rate 1gbit" in text
    assert f"to {ADDRESS['n2']}: delay 2ms jitter 0ms loss 0% rate unlimited" in text
    assert "other destinations: unshaped" in text


def test_a_node_without_shaped_destinations_gets_no_engine():
    pairs = PairTopology("one", ("n1", "n2"), (PairLink("n1", "n2", Profile(name="x", delay_us=5_000)),))
    plan = userspace.plan_pairs(pairs, TOPO, TOPO.nodes)
    assert [c.node for c in plan if isinstance(c, ch.StartEngine)] == ["n1"]
    assert [c.node for c in plan if isinstance(c, ch.AddNfqueueRule)] == ["n1"]


def test_netem_only_keys_and_unknown_nodes_are_refused_naming_the_pair():
    bad = two_regions({"delay": "2ms"}, {"delay": "25ms", "duplicate": "1%"})
    with pytest.raises(BackendUnavailable, match="link n1 -> n3: the userspace backend cannot emulate duplicate"):
        userspace.plan_pairs(bad, TOPO, TOPO.nodes)
    ghost = PairTopology("g", ("n1", "n9"), (PairLink("n1", "n9", Profile(name="x", delay_us=1)),))
    with pytest.raises(UsageError, match="link n1 -> n9: no node n9 in the testbed"):
        userspace.plan_pairs(ghost, TOPO, TOPO.nodes)


def test_the_backend_registers_plan_pairs():
    assert backends.get_backend("userspace").plan_pairs is userspace.plan_pairs
    plan = backends.plan_pairs_apply(PAIRS, TOPO, "userspace")
    assert isinstance(plan[0], ch.ClearRules)


@pytest.fixture
def ex(tmp_path):
    qdiscs, iptables, engines, _ = make_fakes()
    return Executor(journal=Journal(tmp_path / "state"), qdiscs=qdiscs, iptables=iptables, engines=engines)


def _apply_pairs(ex, pairs, seed=0):
    plan = backends.plan_pairs_apply(pairs, TOPO, "userspace", seed=seed, held=ex.held())
    ex.engines.calls.clear(), ex.iptables.calls.clear(), ex.qdiscs.calls.clear()
    ex.apply(plan)
    return plan


def test_a_new_table_reaches_the_running_engines_in_place(ex):
    ex.apply(backends.plan_apply(Profile(name="wan", delay_us=10_000, rate_bps=10**8), TOPO, "userspace",
                                 held=ex.held()))
    before = {k: e["pid"] for k, e in ex.engines.running.items()}
    _apply_pairs(ex, PAIRS)
    # engines reconfigured with their table (not restarted), the aggregate tbf removed, rules kept
    assert ex.engines.methods() == ["reconfigure"] * 4
    assert {k: e["pid"] for k, e in ex.engines.running.items()} == before
    assert ex.iptables.methods() == []
    assert ex.qdiscs.methods() == ["clear"] * 4
    shown = ex.engines.read(TOPO.switch_netns, 3)
    assert [row["dst"] for row in shown["pairs"]] == [ADDRESS["n1"], ADDRESS["n2"], ADDRESS["n4"]]
    assert shown["params"]["delay_us"] == 0
    farther = two_regions({"delay": "2ms"}, {"delay": "50ms"})
    _apply_pairs(ex, farther)
    assert ex.engines.methods() == ["reconfigure"] * 4
    assert ex.engines.read(TOPO.switch_netns, 1)["pairs"][1]["delay_us"] == 50_000
    # back to one profile: the tables go, same engines
    ex.apply(backends.plan_apply(Profile(name="d", delay_us=5_000), TOPO, "userspace", held=ex.held()))
    assert "pairs" not in ex.engines.read(TOPO.switch_netns, 1)
    assert {k: e["pid"] for k, e in ex.engines.running.items()} == before


def test_a_first_pairs_apply_starts_engines_with_their_tables(ex):
    _apply_pairs(ex, PAIRS)
    starts = [call for call in ex.engines.calls if call[0] == "start"]
    assert len(starts) == 4 and all(call[1]["pairs"] for call in starts)


def test_engines_send_the_table_through_the_control_socket(journal, server):  # noqa: F811 - fixtures
    engines = Engines(journal.dir)
    engines.dir.mkdir(parents=True)
    srv = server(engines.control_path("ns1", 3))
    journal.record("process", pid=os.getpid(), start=proc.start_time(os.getpid()), netns="ns1", queue=3,
                   role="engine")
    table = tuple(DestParams(f"10.213.0.{i}", 1_000 * i, rate_bps=10**9) for i in range(2, 65))  # 63 peers
    assert engines.reconfigure("ns1", 3, 0, 0, 0.0, 5, journal, pairs=table) is True
    assert srv.params == EngineParams(0, 0, 0.0, 5, table)
    assert engines.reconfigure_many([("ns1", 3, 1_000, 0, 0.0, 5)], journal) == [True]
    assert srv.params == EngineParams(1_000, 0, 0.0, 5)
