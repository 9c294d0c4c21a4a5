"""netbench.emulation.changes plans, and the Executor running them on fake adapters."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from tests.fakes.netlink import FakeEngines, FakeIptables, FakeQdiscs, make_fakes

from netbench.emulation import backends, changes as ch
from netbench.emulation.executor import BackendChoice, Executor, choose_backend, read_emulation, recorded_distributions
from netbench.emulation.netlink.netem import NETEM_RATE32_MAX_BPS
from netbench.errors import BackendUnavailable, EmulationError, StateError, UsageError
from netbench.state.journal import Journal
from netbench.model.profile import MAX_LIMIT_PACKETS, Profile
from netbench.model.topology import plan_topology

TOPO = plan_topology(2, ipaddress.ip_network("10.213.0.0/24"))
FULL = Profile(name="full", delay_us=10_000, jitter_us=1_000, loss=0.01, rate_bps=250_000_000)


def kinds(plan):
    return [(type(c).__name__, c.node) for c in plan]


# ---------------------------------------------------------------- pure plans


def test_netem_plan_shapes_each_node_in_place():
    plan = backends.plan_apply(FULL, TOPO, "netem")
    assert kinds(plan) == [
        ("ClearRules", "switch"), ("StopEngine", "n1"), ("StopEngine", "n2"),
        ("ShapeDevice", "n1"), ("ClearIngress", "n1"), ("ShapeDevice", "n2"), ("ClearIngress", "n2")]
    shape = plan[3]
    assert (shape.netns, shape.dev, shape.uses_htb) == ("netbench-n1", "eth0", False)
    n = shape.netem
    assert (n.delay_us, n.jitter_us, n.loss, n.rate_bps) == (10_000, 1_000, 0.01, 250_000_000)
    assert n.limit == ch.netem_limit_packets(10_000, 1_000, 250_000_000)


def test_netem_limit_from_the_profile_wins():
    plan = backends.plan_apply(dataclasses.replace(FULL, limit_packets=77), TOPO, "netem")
    assert {c.netem.limit for c in plan if isinstance(c, ch.ShapeDevice)} == {77}


def test_rate_beyond_netem_32_bits_goes_to_an_htb_parent():
    fast = Profile(delay_us=1_000, rate_bps=40_000_000_000)
    shape = next(c for c in backends.plan_apply(fast, TOPO, "netem") if isinstance(c, ch.ShapeDevice))
    assert shape.uses_htb and shape.htb_rate_bps == 40_000_000_000 and shape.netem.rate_bps is None
    assert ch.htb_burst_bytes(40_000_000_000) == 5_000_000  # 1 ms of the rate, not a fixed 15 KB
    just_fits = Profile(delay_us=1_000, rate_bps=NETEM_RATE32_MAX_BPS)
    shape = next(c for c in backends.plan_apply(just_fits, TOPO, "netem") if isinstance(c, ch.ShapeDevice))
    assert not shape.uses_htb and shape.netem.rate_bps == NETEM_RATE32_MAX_BPS


def test_peers_become_htb_classes_with_filters():
    topo3 = plan_topology(3, ipaddress.ip_network("10.213.0.0/24"))
    profile = Profile(delay_us=5_000, peers=("n2", "n1", "192.0.2.0/24"))
    plan = [c for c in backends.plan_apply(profile, topo3, "netem") if isinstance(c, ch.ShapeDevice)]
    n1, n2, n3 = plan
    assert n1.peers == (f"{topo3.nodes[1].address}/32", "192.0.2.0/24")  # not itself
    assert n3.peers == (f"{topo3.nodes[1].address}/32", f"{topo3.nodes[0].address}/32", "192.0.2.0/24")
    assert n3.uses_htb and n3.class_count() == 3 and n3.match == "dst"
    text = n3.describe()
    assert "htb default 0" in text and text.count("u32 match ip dst") == 3


def test_duplicate_with_several_peers_is_refused_before_anything_is_applied():
    profile = Profile(delay_us=5_000, duplicate=0.01, peers=("n2", "192.0.2.0/24"))
    with pytest.raises(UsageError, match="n1: duplicate with 2 peers"):
        backends.plan_apply(profile, TOPO, "netem")
    one_peer = [c for c in backends.plan_apply(dataclasses.replace(profile, peers=("n2",)), TOPO, "netem")
                if isinstance(c, ch.ShapeDevice)]
    assert [(c.node, c.class_count()) for c in one_peer] == [("n1", 1)] and one_peer[0].netem.duplicate == 0.01


def test_unknown_peer_node_is_a_usage_error():
    with pytest.raises(UsageError, match="no node n7"):
        backends.plan_apply(Profile(delay_us=1_000, peers=("n7",)), TOPO, "netem")


@pytest.mark.parametrize("direction, devices", [
    ("egress", ["eth0"]), ("ingress", ["nbifb-eth0"]), ("both", ["eth0", "nbifb-eth0"])])
def test_direction_shapes_egress_ingress_or_both(direction, devices):
    plan = [c for c in backends.plan_apply(dataclasses.replace(FULL, direction=direction), TOPO, "netem") if c.node == "n1"]
    assert [c.dev for c in plan if isinstance(c, ch.ShapeDevice)] == devices
    assert any(isinstance(c, ch.SetIngress) for c in plan) == (direction != "egress")
    assert any(isinstance(c, ch.ClearQdisc) for c in plan) == (direction == "ingress")
    for c in plan:
        if isinstance(c, ch.ShapeDevice):
            assert c.match == ("src" if c.dev.startswith("nbifb") else "dst")


def test_userspace_refuses_what_only_netem_can_do():
    with pytest.raises(BackendUnavailable, match="cannot emulate distribution, duplicate"):
        backends.plan_apply(dataclasses.replace(FULL, distribution="normal", duplicate=0.01), TOPO, "userspace")


def test_userspace_plan_order():
    plan = backends.plan_apply(FULL, TOPO, "userspace")
    assert kinds(plan) == [
        ("ClearRules", "switch"), ("StopEngine", "n1"), ("StopEngine", "n2"),
        ("ClearIngress", "n1"), ("ClearIngress", "n2"),
        ("ClearQdisc", "n1"), ("SetTbf", "n1"), ("StartEngine", "n1"), ("AddNfqueueRule", "n1"),
        ("ClearQdisc", "n2"), ("SetTbf", "n2"), ("StartEngine", "n2"), ("AddNfqueueRule", "n2"),
    ]


def test_userspace_engines_get_distinct_seeds():
    plan = backends.plan_apply(FULL, TOPO, "userspace", seed=7)
    seeds = [c.seed for c in plan if isinstance(c, ch.StartEngine)]
    assert seeds == [7, 8]


def test_userspace_rate_only_needs_no_engine():
    plan = backends.plan_apply(Profile(rate_bps=10**8), TOPO, "userspace")
    assert [type(c).__name__ for c in plan if not isinstance(
        c, (ch.ClearRules, ch.StopEngine, ch.ClearQdisc, ch.ClearIngress))] == ["SetTbf", "SetTbf"]


def test_userspace_delay_only_needs_no_tbf():
    plan = backends.plan_apply(Profile(delay_us=1_000), TOPO, "userspace")
    assert not any(isinstance(c, ch.SetTbf) for c in plan)
    assert sum(isinstance(c, ch.StartEngine) for c in plan) == 2


@pytest.mark.parametrize("backend", ["netem", "userspace"])
def test_null_profile_only_clears(backend):
    plan = backends.plan_apply(Profile(), TOPO, backend)
    assert sorted(map(repr, plan)) == sorted(map(repr, ch.plan_clear(TOPO)))
    assert plan


def test_unknown_backend():
    with pytest.raises(ValueError):
        backends.plan_apply(FULL, TOPO, "tc")


def test_netem_limit_packets():
    # no rate: sized for 10 Gbit/s, never below netem's default
    assert ch.netem_limit_packets(0, 0, None) == 1000
    assert ch.netem_limit_packets(1_000, 0, None) == 1239  # 1.25 MB = 825.6 frames; x1.5 -> 1239
    # 9 s at the default 10 Gbit/s would be 1.1e7 frames: capped to what a profile may set
    assert ch.netem_limit_packets(9_000_000, 0, None) == MAX_LIMIT_PACKETS
    # a rate: 1.5x the delay line plus the engine's tbf queue (50 ms of the rate and its burst)
    # 1 gbit/s, 100 ms: the line 8256.3 frames, x1.5 = 12384.4 -> 12385; the queue 6.375 MB -> 4211
    assert ch.netem_limit_packets(100_000, 0, 10**9) == 12385 + 4211
    assert ch.netem_limit_packets(90_000, 10_000, 10**9) == ch.netem_limit_packets(100_000, 0, 10**9)
    # 20 mbit/s, 1 ms: 2.5 KB in the line (2.5 frames -> 3) and the least queue, 100 packets, where
    # netem's old floor of 1000 frames held 600 ms at this rate
    assert ch.netem_limit_packets(1_000, 0, 20_000_000) == 3 + 100
    queue_s = (ch.netem_limit_packets(0, 0, 20_000_000) * ch.MTU_FRAME_BYTES) / (20_000_000 / 8)
    assert 0.05 <= queue_s < 0.07  # the engine's 50 ms at the rate, give or take a frame's rounding
    assert ch.netem_limit_packets(0, 0, 10**6) == ch.NETEM_RATE_QUEUE_MIN_PACKETS


def test_tbf_sizes():
    assert ch.tbf_burst_bytes(10**6) == 4 * ch.MTU_FRAME_BYTES  # 125 bytes/ms is below four frames
    assert ch.tbf_burst_bytes(10**10) == 1_250_000  # 1 ms of 10 gbit/s
    assert ch.tbf_limit_bytes(10**9) == 6_250_000 + 125_000


def test_describe_lines():
    plan = {type(c).__name__: c for c in backends.plan_apply(FULL, TOPO, "netem") + backends.plan_apply(FULL, TOPO, "userspace")
            if c.node == "n1"}
    assert plan["ShapeDevice"].describe() == (
        "n1: tc qdisc replace dev eth0 root handle 4e42: netem limit "
        f"{ch.netem_limit_packets(10_000, 1_000, 250_000_000)} delay 10ms 1ms distribution uniform "
        "loss random 1% rate 250mbit")
    assert plan["SetTbf"].describe().startswith("n1: tc qdisc replace dev eth0 root handle 4e42: tbf rate 250mbit")
    assert plan["AddNfqueueRule"].describe() == \
        "n1: in netbench-sw: iptables -t mangle -A NETBENCH -m physdev --physdev-in nb-n1 -j NFQUEUE --queue-num 1"
    assert "delay 10ms jitter 1ms loss 1% seed 0" in plan["StartEngine"].describe()


# ---------------------------------------------------------------- executor on fakes


@pytest.fixture
def journal(tmp_path):
    return Journal(tmp_path / "state")


def executor(journal, before=None):
    qdiscs, iptables, engines, log = make_fakes(before)
    return Executor(journal=journal, qdiscs=qdiscs, iptables=iptables, engines=engines), log


def pending_summary(journal):
    return sorted((e.kind, e.data.get("netns")) for e in journal.pending())


def test_netem_apply_sets_qdiscs(journal):
    ex, log = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    for node in TOPO.nodes:
        q = ex.qdiscs.read(node.netns, node.ifname)
        n = q["netem"]
        assert q["kind"] == "netem" and not q["live_change"]
        assert (n.delay_us, n.jitter_us, n.rate_bps) == (10_000, 1_000, 250_000_000)
        assert n.loss == pytest.approx(0.01, abs=1e-9)
    assert pending_summary(journal) == [("qdisc", "netbench-n1"), ("qdisc", "netbench-n2")]
    assert [e.data for e in journal.pending()][0] == {"netns": "netbench-n1", "ifname": "eth0",
                                                      "handle": ch.QDISC_HANDLE, "distribution": "uniform",
                                                      "qdisc_kind": "netem"}
    assert ex.done == backends.plan_apply(FULL, TOPO, "netem")


def test_userspace_apply_sets_tbf_engine_and_rule(journal):
    ex, log = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "userspace", seed=3))
    for position, node in enumerate(TOPO.nodes):
        assert ex.qdiscs.read(node.netns, node.ifname)["kind"] == "tbf"
        assert ex.qdiscs.read(node.netns, node.ifname)["rate_bps"] == 250_000_000
        assert f"-A NETBENCH -m physdev --physdev-in {node.port} -j NFQUEUE --queue-num {position + 1}" \
            in ex.iptables.rules(TOPO.switch_netns)
        params = ex.engines.read(TOPO.switch_netns, position + 1)["params"]
        assert (params["delay_us"], params["jitter_us"], params["loss"], params["seed"]) == \
            (10_000, 1_000, 0.01, 3 + position)
    assert pending_summary(journal) == [("iptables", "netbench-sw"), ("iptables", "netbench-sw"),
                                        ("process", "netbench-sw"), ("process", "netbench-sw"),
                                        ("qdisc", "netbench-n1"), ("qdisc", "netbench-n2")]
    # the engine of a node is started before its rule sends packets to its queue
    order = [m for a, m, k in log if m in ("start", "add_rule")]
    assert order == ["start", "add_rule", "start", "add_rule"]


def test_journal_entry_is_written_before_each_change(journal):
    seen = []

    def before(adapter, method, kwargs):
        if method in ("shape", "replace_tbf"):
            seen.append(("qdisc", kwargs["netns"]) in pending_summary(journal))
        elif method == "add_rule":
            seen.append(("iptables", kwargs["netns"]) in pending_summary(journal))

    ex, _ = executor(journal, before)
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    ex.apply(backends.plan_apply(FULL, TOPO, "userspace"))
    assert seen == [True] * 6


class FailingJournal(Journal):
    def record(self, kind, **data):
        raise StateError("cannot write journal: disk full")


@pytest.mark.parametrize("backend, method", [("netem", "shape"), ("userspace", "replace_tbf")])
def test_change_is_not_made_when_the_journal_cannot_be_written(tmp_path, backend, method):
    ex, _ = executor(FailingJournal(tmp_path))
    with pytest.raises(StateError):
        ex.apply(backends.plan_apply(FULL, TOPO, backend))
    assert method not in ex.qdiscs.methods()
    assert ex.qdiscs.state == {}


# a remote host's own qdiscs: netbench replaces only its own or the kernel's default


@pytest.mark.parametrize("backend", ["netem", "userspace"])
@pytest.mark.parametrize("kind, handle", [("htb", 0x10000), ("fq", 0x80010000), ("tbf", 0x4E420000)])
def test_a_root_qdisc_netbench_did_not_set_is_refused_before_any_change(journal, backend, kind, handle):
    """Someone's own root (4e42: too, when the journal does not hold it) stays; nothing at all is applied."""
    ex, log = executor(journal)
    ex.qdiscs.foreign[("netbench-n2", "eth0")] = (kind, handle)
    with pytest.raises(EmulationError, match=f"n2: eth0 has a root qdisc {kind} {handle >> 16:x}: that netbench did not set"):
        ex.apply(backends.plan_apply(FULL, TOPO, backend))
    assert log == [] and journal.pending() == []
    assert ex.qdiscs.foreign == {("netbench-n2", "eth0"): (kind, handle)}


@pytest.mark.parametrize("kind", ["noqueue", "pfifo_fast", "mq", "fq_codel"])
def test_the_kernels_default_root_is_replaced(journal, kind):
    ex, _ = executor(journal)
    for node in TOPO.nodes:
        ex.qdiscs.foreign[(node.netns, node.ifname)] = (kind, 0)  # handle 0: the kernel's own
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    assert all(ex.qdiscs.read(node.netns, node.ifname)["kind"] == "netem" for node in TOPO.nodes)


@pytest.mark.parametrize("kind", ["ingress", "clsact"])
def test_an_ingress_qdisc_netbench_did_not_set_is_refused_before_any_change(journal, kind):
    ex, log = executor(journal)
    ex.qdiscs.foreign_ingress[("netbench-n1", "eth0")] = kind
    with pytest.raises(EmulationError, match=f"n1: eth0 has a qdisc {kind} at its ingress that netbench did not set"):
        ex.apply(backends.plan_apply(dataclasses.replace(FULL, direction="both"), TOPO, "netem"))
    assert log == [] and journal.pending() == []


def test_netbench_replaces_its_own_root_and_ingress(journal):
    ex, _ = executor(journal)
    both = dataclasses.replace(FULL, direction="both")
    ex.apply(backends.plan_apply(both, TOPO, "netem"))
    ex.apply(backends.plan_apply(dataclasses.replace(both, delay_us=20_000), TOPO, "netem"))
    ex.apply(backends.plan_apply(FULL, TOPO, "userspace"))
    assert ex.qdiscs.read("netbench-n1", "eth0")["kind"] == "tbf"


def test_clear_resolves_journal_entries(journal):
    ex, _ = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "userspace"))
    assert journal.pending()
    ex.apply(ch.plan_clear(TOPO))
    assert journal.pending() == []
    assert ex.iptables.rules(TOPO.switch_netns) == []
    for position, node in enumerate(TOPO.nodes):
        assert ex.qdiscs.read(node.netns, node.ifname) is None
        assert ex.engines.read(TOPO.switch_netns, position + 1) is None


def test_clear_resolves_only_matching_entries(journal):
    other = journal.record("qdisc", netns="netbench-n9", ifname="eth0", handle=ch.QDISC_HANDLE)
    ns = journal.record("netns", name="netbench-n1")
    ex, _ = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    ex.apply(ch.plan_clear(TOPO))
    assert [e.id for e in journal.pending()] == [other.id, ns.id]


@pytest.mark.parametrize("backend", ["netem", "userspace"])
def test_apply_twice_is_idempotent(journal, backend):
    ex, _ = executor(journal)
    plan = backends.plan_apply(FULL, TOPO, backend)
    ex.apply(plan)
    def state():
        qdiscs = {k: {f: v for f, v in q.items() if f != "live_change"} for k, q in ex.qdiscs.state.items()}
        return (qdiscs, {k: list(v) for k, v in ex.iptables.chains.items()},
                {k: v["params"] for k, v in ex.engines.running.items()})

    state_once = state()
    pending_once = pending_summary(journal)
    ex.apply(plan)  # the fake engines raise if an engine is started twice in a namespace
    state_twice = state()
    assert state_twice == state_once
    assert pending_summary(journal) == pending_once


def test_changing_profile_replaces_the_old_one(journal):
    ex, _ = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "userspace"))
    ex.apply(backends.plan_apply(Profile(delay_us=50_000), TOPO, "userspace"))
    assert len(ex.iptables.rules(TOPO.switch_netns)) == 2  # one per node, the old ones gone
    for position, node in enumerate(TOPO.nodes):
        assert ex.qdiscs.read(node.netns, node.ifname) is None  # the tbf went away with the rate
        assert ex.engines.read(TOPO.switch_netns, position + 1)["params"]["delay_us"] == 50_000


def test_userspace_clears_a_previous_netem(journal):
    ex, _ = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    ex.apply(backends.plan_apply(Profile(delay_us=5_000), TOPO, "userspace"))
    for node in TOPO.nodes:
        assert ex.qdiscs.read(node.netns, node.ifname) is None
    assert ("qdisc", "netbench-n1") not in pending_summary(journal)


def test_netem_clears_a_previous_userspace(journal):
    ex, _ = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "userspace"))
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    assert ex.iptables.rules(TOPO.switch_netns) == []
    for position, node in enumerate(TOPO.nodes):
        assert ex.engines.read(TOPO.switch_netns, position + 1) is None


def test_on_change_sees_every_change_in_order(journal):
    seen = []
    qdiscs, iptables, engines = FakeQdiscs(), FakeIptables(), FakeEngines()
    ex = Executor(journal=journal, qdiscs=qdiscs, iptables=iptables, engines=engines, on_change=seen.append)
    plan = backends.plan_apply(FULL, TOPO, "userspace")
    ex.apply(plan)
    assert seen == plan


# ---------------------------------------------------------------- read-back and backend choice


def test_read_emulation_netem(journal):
    ex, _ = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    rows = read_emulation(TOPO, ex.qdiscs, ex.iptables, ex.engines)
    assert [r["node"] for r in rows] == ["n1", "n2"]
    assert {r["backend"] for r in rows} == {"netem"}
    assert rows[0]["qdisc"]["netem"].delay_us == 10_000
    assert rows[0]["profile"]["delay"] == "10ms" and rows[0]["profile"]["rate"] == "250mbit"
    assert rows[0]["engine"] is None and rows[0]["nfqueue_rules"] == []


def test_a_second_profile_is_a_live_change_with_one_journal_entry(journal):
    ex, _ = executor(journal)
    ex.apply(backends.plan_apply(FULL, TOPO, "netem"))
    ex.apply(backends.plan_apply(dataclasses.replace(FULL, delay_us=50_000, distribution="pareto"), TOPO, "netem"))
    q = ex.qdiscs.read("netbench-n1", "eth0")
    assert q["live_change"] and q["netem"].delay_us == 50_000
    assert pending_summary(journal) == [("qdisc", "netbench-n1"), ("qdisc", "netbench-n2")]
    assert recorded_distributions(journal)[("netbench-n1", "eth0")] == "pareto"


def test_read_emulation_userspace_and_empty(journal):
    ex, _ = executor(journal)
    rows = read_emulation(TOPO, ex.qdiscs, ex.iptables, ex.engines)
    assert [r["backend"] for r in rows] == [None, None]
    ex.apply(backends.plan_apply(FULL, TOPO, "userspace"))
    rows = read_emulation(TOPO, ex.qdiscs, ex.iptables, ex.engines)
    assert [r["backend"] for r in rows] == ["userspace", "userspace"]
    assert rows[1]["engine"]["params"]["delay_us"] == 10_000
    assert rows[1]["profile"]["delay"] == "10ms" and rows[1]["profile"]["loss"] == "1%"


def probe(result):
    calls = []

    def fn():
        calls.append(1)
        return result

    fn.calls = calls
    return fn


def test_choose_backend_auto():
    assert choose_backend(None, probe((True, "has netem"))) == BackendChoice("netem", "has netem")
    assert choose_backend("auto", probe((True, "has netem"))).name == "netem"
    choice = choose_backend(None, probe((False, "no sch_netem")))
    assert choice.name == "userspace" and "no sch_netem" in choice.reason


def test_choose_backend_requested():
    p = probe((False, "no"))
    assert choose_backend("userspace", p).name == "userspace"
    assert p.calls == []  # no probe needed
    assert choose_backend("netem", probe((True, "yes"))).name == "netem"
    with pytest.raises(BackendUnavailable, match="no sch_netem"):
        choose_backend("netem", probe((False, "no sch_netem")))
    with pytest.raises(UsageError, match="--backend"):
        choose_backend("tc", probe((True, "yes")))


def test_a_long_sweeps_changes_do_not_each_reread_the_journal(journal):
    """Every live change looks up pending entries (to resolve or replace them); the journal
    grows with each change until the sweep ends, and must not be re-read whole each time."""
    from tests.unit.test_journal import bytes_read

    ex, _ = executor(journal)
    for backend in ("netem", "userspace") * 50:
        ex.apply(backends.plan_apply(FULL if backend == "netem" else dataclasses.replace(FULL, jitter_us=0), TOPO, backend))
    size = journal.path.stat().st_size
    before = bytes_read()
    for delay_us in range(1_000, 101_000, 1_000):
        ex.apply(backends.plan_apply(dataclasses.replace(FULL, delay_us=delay_us), TOPO, "netem"))
    # per change, less than a tenth of the journal (before: the whole of it, ~8 times)
    assert (bytes_read() - before) / 100 < size / 10
    assert pending_summary(journal) == [("qdisc", "netbench-n1"), ("qdisc", "netbench-n2")]


def test_a_long_lived_executor_keeps_only_its_last_applys_changes(journal):
    """The embedded testbed's executor lives for the whole sweep: it must not keep every
    change of every run."""
    ex, _ = executor(journal)
    for delay_us in range(1_000, 51_000, 1_000):
        ex.apply(backends.plan_apply(dataclasses.replace(FULL, delay_us=delay_us), TOPO, "netem"))
    assert ex.done == backends.plan_apply(dataclasses.replace(FULL, delay_us=50_000), TOPO, "netem")


# --- the backend registry (emulation/backends/) -------------------------------

def test_registry_holds_each_backend_with_plan_refusal_readback_and_probe():
    assert list(backends.BACKENDS) == ["netem", "userspace", "rateonly"]
    assert backends.CHOOSABLE == ("netem", "userspace")  # rateonly is what "userspace" means on a host
    for name, backend in backends.BACKENDS.items():
        assert backend.name == name and callable(backend.plan) and callable(backend.refuse)
        assert backend.on_hosts in backends.BACKENDS
    assert backends.BACKENDS["netem"].probe is not None
    assert backends.get_backend("userspace", on_host=True).name == "rateonly"
    assert backends.get_backend("netem", on_host=True).name == "netem"
    with pytest.raises(ValueError):
        backends.get_backend("tc")


def test_readback_names_the_backend_whose_state_a_node_holds():
    assert backends.backend_held({"kind": "netem"}, None, []) == "netem"
    assert backends.backend_held(None, {"kind": "htb"}, []) == "netem"
    assert backends.backend_held({"kind": "tbf"}, None, []) == "userspace"
    assert backends.backend_held(None, None, ["-A netbench ..."]) == "userspace"
    assert backends.backend_held(None, None, []) is None


def test_rateonly_refuses_delay_and_plans_a_tbf():
    node = TOPO.nodes[0]
    with pytest.raises(BackendUnavailable, match="host n1: without netem a remote host shapes rate only"):
        backends.BACKENDS["rateonly"].plan(Profile(delay_us=1000), TOPO, (node,), 0)
    plan = backends.BACKENDS["rateonly"].plan(Profile(rate_bps=10**8), TOPO, (node,), 0)
    assert [type(c).__name__ for c in plan] == ["ClearIngress", "ClearQdisc", "SetTbf"]
