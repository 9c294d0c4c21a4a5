"""The netem backend against a real kernel with sch_netem (`make test-kernel` boots Debian's
stock kernel under qemu for this; the file runs unchanged on any host whose kernel has netem).

Every feature is applied on the testbed's namespaces and veths through netbench's own code,
read back through pyroute2 (netbench's decoder) and through `tc -j` (a client netbench did
not write), changed live, and reset; plus coarse timing checks. Timing under software
emulation is noisy, so only the direction and rough size of effects are asserted.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from tests.netem_checks import kernel_view
from tests.strategies import valid_profiles

from netbench import units
from netbench.emulation import backends, changes as ch
from netbench.emulation.engines import Engines
from netbench.emulation.iptables import Iptables
from netbench.emulation.netlink.qdisc import NetlinkQdiscs
from netbench.emulation.executor import real_executor, read_emulation, recorded_distributions
from netbench.model.profile import Profile, profile_from_mapping

from tests.kernel.conftest import bed_of

pytestmark = [pytest.mark.root, pytest.mark.netem]


@pytest.fixture(scope="module")
def bed(netem_kernel, tmp_path_factory):
    """A 2-node testbed for the whole module; reset afterwards, checked to leave nothing."""
    with bed_of(2, tmp_path_factory.mktemp("state")) as (topo, journal):
        yield topo, journal, real_executor(journal)


def apply_and_read(bed, profile):
    topo, journal, ex = bed
    ex.apply(backends.plan_apply(profile, topo, "netem"))
    return read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(journal.dir), recorded_distributions(journal))


def tc_json(netns, *args):
    out = subprocess.run(["ip", "netns", "exec", netns, "tc", "-j", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


FEATURES = {
    "delay+jitter normal, correlation, random loss with correlation": Profile(
        delay_us=10_000, jitter_us=2_000, jitter_correlation=0.25, distribution="normal", loss=0.01,
        loss_correlation=0.1),
    "pareto, duplicate, corrupt, reorder with gap, 32-bit rate": Profile(
        delay_us=20_000, jitter_us=5_000, distribution="pareto", duplicate=0.02, duplicate_correlation=0.3,
        corrupt=0.001, corrupt_correlation=0.2, reorder=0.25, reorder_correlation=0.5, reorder_gap=5,
        rate_bps=250_000_000),
    "paretonormal, Gilbert-Elliott, queue limit": Profile(
        delay_us=5_000, jitter_us=1_000, distribution="paretonormal", loss_model="gilbert-elliott", ge_p=0.01,
        ge_r=0.3, ge_bad_loss=0.9, ge_good_loss=0.001, limit_packets=5000),
    "64-bit rate through htb": Profile(delay_us=1_000, rate_bps=40_000_000_000),
    "per-peer shaping": Profile(delay_us=3_000, rate_bps=100_000_000, peers=("n2",)),
    "ingress through ifb": Profile(delay_us=4_000, loss=0.05, direction="ingress"),
    "both directions": Profile(delay_us=2_000, direction="both", rate_bps=500_000_000),
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_feature_round_trips_through_the_kernel(bed, name):
    profile = FEATURES[name]
    topo = bed[0]
    rows = apply_and_read(bed, profile)
    for index, row in enumerate(rows):
        if profile.peers and not ch.resolve_peers(profile, topo, topo.nodes[index]):
            assert row["profile"] is None
            continue
        assert kernel_view(profile_from_mapping(row["profile"], "read-back")) == kernel_view(profile, topo, index)
    # a client netbench did not write sees the same thing
    dev = "nbifb-eth0" if profile.direction == "ingress" else "eth0"
    qdiscs = tc_json("netbench-n1", "qdisc", "show", "dev", dev)
    netem = next(q for q in qdiscs if q["kind"] == "netem")
    options = netem["options"]
    assert options["delay"]["delay"] == pytest.approx(profile.delay_us / 1e6)
    assert options["delay"]["jitter"] == pytest.approx(profile.jitter_us / 1e6)
    if profile.loss:
        assert options["loss-random"]["loss"] == pytest.approx(profile.loss)
    if profile.uses_ge:
        ge = options["loss-gemodel"]
        assert (ge["p"], ge["r"]) == (pytest.approx(profile.ge_p), pytest.approx(profile.ge_r))
        assert ge["1-h"] == pytest.approx(profile.ge_bad_loss) and ge["1-k"] == pytest.approx(profile.ge_good_loss)
    if profile.duplicate:
        assert options["duplicate"]["duplicate"] == pytest.approx(profile.duplicate)
    if profile.reorder:
        assert options["reorder"]["reorder"] == pytest.approx(profile.reorder) and options["gap"] == profile.reorder_gap
    if profile.corrupt:
        assert options["corrupt"]["corrupt"] == pytest.approx(profile.corrupt)
    if profile.limit_packets:
        assert options["limit"] == profile.limit_packets
    shapes = [c for c in backends.plan_apply(profile, topo, "netem") if isinstance(c, ch.ShapeDevice) and c.node == "n1"]
    if shapes[0].uses_htb:
        # iproute2 6.1 prints htb classes as text even under -j
        classes = subprocess.run(["ip", "netns", "exec", "netbench-n1", "tc", "class", "show", "dev", dev],
                                 capture_output=True, text=True, check=True).stdout
        assert f"class htb 4e42:1 root leaf 4e43: prio 0 rate {units.format_rate_bps(profile.rate_bps)}" \
            .replace("gbit", "Gbit").replace("mbit", "Mbit") in classes, classes
    elif profile.rate_bps:
        assert "rate" in options


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(profile=valid_profiles())
def test_generated_profiles_round_trip_with_live_changes(bed, profile):
    topo = bed[0]
    rows = apply_and_read(bed, profile)
    for index, row in enumerate(rows):
        if profile.is_null or (profile.peers and not ch.resolve_peers(profile, topo, topo.nodes[index])):
            assert row["profile"] is None
            continue
        assert kernel_view(profile_from_mapping(row["profile"], "read-back")) == kernel_view(profile, topo, index)


def _ping(topo, count=20, interval="0.05"):
    out = subprocess.run(["ip", "netns", "exec", topo.nodes[0].netns, "ping", "-q", "-c", str(count), "-i", interval,
                          "-W", "2", topo.nodes[1].address], capture_output=True, text=True)
    loss = float(re.search(r"([0-9.]+)% packet loss", out.stdout).group(1)) / 100
    rtt = re.search(r"= [0-9.]+/([0-9.]+)/", out.stdout)
    return loss, float(rtt.group(1)) if rtt else None


def test_live_change_keeps_the_qdisc_and_its_counters(bed):
    topo = bed[0]
    apply_and_read(bed, Profile(delay_us=1_000))
    _ping(topo, count=10, interval="0.02")
    before = NetlinkQdiscs().read("netbench-n1", "eth0")
    apply_and_read(bed, Profile(delay_us=3_000, distribution="normal", jitter_us=500))
    after = NetlinkQdiscs().read("netbench-n1", "eth0")
    assert after["netem"].delay_us == 3_000
    assert after["packets"] >= before["packets"] > 0  # a replaced qdisc would start from zero


def test_rtt_rises_with_delay_and_loss_shows(bed):
    topo = bed[0]
    apply_and_read(bed, Profile())
    _, base_rtt = _ping(topo)
    apply_and_read(bed, Profile(delay_us=50_000))
    _, slow_rtt = _ping(topo)
    assert slow_rtt - base_rtt > 80  # 2 x 50 ms, with a wide margin for emulation noise
    apply_and_read(bed, Profile(loss=0.5))
    loss, _ = _ping(topo, count=100, interval="0.02")
    assert 0.5 < loss < 0.95  # both directions lose 50 %: ~75 % of round trips fail


def test_clear_removes_every_netbench_qdisc_and_the_ifb(bed):
    topo, _, ex = bed
    apply_and_read(bed, Profile(delay_us=2_000, direction="both", peers=("n2",)))
    ex.apply(ch.plan_clear(topo))
    for node in topo.nodes:
        kinds = {q["kind"] for q in tc_json(node.netns, "qdisc", "show", "dev", "eth0")}
        assert "netem" not in kinds and "htb" not in kinds and "ingress" not in kinds
        links = subprocess.run(["ip", "-n", node.netns, "-o", "link"], capture_output=True, text=True).stdout
        assert "nbifb-" not in links


@pytest.mark.parametrize("direction, peers", [("egress", ()), ("ingress", ("192.0.2.0/24",))])
def test_a_live_change_from_gilbert_elliott_back_to_random_loss(bed, direction, peers):
    """netem_change() keeps the loss model unless TCA_NETEM_LOSS is absent: a live change (the
    same tree, netem `change`) from Gilbert-Elliott to random loss must not send an (empty) loss
    attribute. Before the fix the Gilbert-Elliott model stayed."""
    topo = bed[0]
    ge = Profile(delay_us=5_000, loss_model="gilbert-elliott", ge_p=0.01, ge_r=0.3, ge_bad_loss=0.9,
                 ge_good_loss=0.001, direction=direction, peers=peers)
    plain = Profile(delay_us=6_000, loss=0.02, direction=direction, peers=peers)
    apply_and_read(bed, ge)
    rows = apply_and_read(bed, plain)
    assert kernel_view(profile_from_mapping(rows[0]["profile"], "read-back")) == kernel_view(plain, topo, 0)
    dev = "nbifb-eth0" if direction == "ingress" else "eth0"
    netem = next(q for q in tc_json("netbench-n1", "qdisc", "show", "dev", dev) if q["kind"] == "netem")
    assert "loss-gemodel" not in netem["options"] and netem["options"]["loss-random"]["loss"] == pytest.approx(0.02)


def _apply_in_place(bed, profile):
    """A change planned against what the journal says netbench holds (in place, as a sweep or a
    schedule makes it); returns the plan."""
    topo, _, ex = bed
    plan = backends.plan_apply(profile, topo, "netem", held=ex.held())
    ex.apply(plan)
    return plan


def test_live_delay_changes_under_a_running_ping_lose_nothing(bed):
    """Delay 10 ms, 20 ms, alternately, 20 changes in place while ping runs every 10 ms: no
    echo is lost (icmp_seq has no gap) and no RTT is below 2 x 10 ms (the link is never unshaped)."""
    import signal
    import time

    topo = bed[0]
    _apply_in_place(bed, Profile())  # from nothing shaped
    _apply_in_place(bed, Profile(delay_us=10_000))
    ping = subprocess.Popen(["ip", "netns", "exec", topo.nodes[0].netns, "ping", "-n", "-i", "0.01",
                             topo.nodes[1].address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        for i in range(20):
            plan = _apply_in_place(bed, Profile(delay_us=20_000 if i % 2 == 0 else 10_000))
            assert not any(isinstance(c, (ch.ClearQdisc, ch.ClearIngress)) for c in plan), plan
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        ping.send_signal(signal.SIGINT)
        out, err = ping.communicate(timeout=30)
    seqs = [int(m) for m in re.findall(r"icmp_seq=(\d+)", out)]
    rtts = [float(m) for m in re.findall(r"time=([0-9.]+) ms", out)]
    assert len(seqs) > 40, (out, err)
    assert sorted(seqs) == list(range(1, max(seqs) + 1)), f"lost: {set(range(1, max(seqs) + 1)) - set(seqs)}"
    assert min(rtts) >= 20.0, sorted(rtts)[:5]
    _apply_in_place(bed, Profile())


def test_a_schedules_steps_read_back_through_tc_as_each_lands(bed, tmp_path):
    """`run_schedule` on the embedded target, 3 steps (delay, then rate, then loss): as each
    change lands, `tc -j qdisc show` in the namespace shows that step's netem options."""
    from netbench.experiment.schedule import PlanCache, link_before, run_schedule
    from netbench.model.schedule import load_schedule, timeline
    from netbench.testbed.embedded import EmbeddedTestbed

    topo, journal, _ = bed
    _apply_in_place(bed, Profile())
    path = tmp_path / "steps.yaml"
    # a second apart: a step that lands after the next one's time is folded into it (the
    # schedule keeps time), and under software emulation a `tc` read-back takes a few hundred ms
    path.write_text("name: steps\nsteps:\n  - {at: 0s, delay: 10ms}\n  - {at: 1s, rate: 50mbit}\n"
                    "  - {at: 2s, loss: 5%}\n")
    target = EmbeddedTestbed(journal)
    entries = timeline(load_schedule(path), link_before(target.show()))
    seen = []

    def check(landed):
        (netem,) = [q for q in tc_json(topo.nodes[0].netns, "qdisc", "show", "dev", topo.nodes[0].ifname)
                    if q["kind"] == "netem"]
        options = netem["options"]
        seen.append(landed.index)
        assert options["delay"]["delay"] == pytest.approx(0.010), options
        if landed.index >= 1:
            assert options["rate"]["rate"] == 50_000_000 // 8, options
        else:
            assert "rate" not in options, options
        loss = options.get("loss-random", {}).get("loss", 0)
        assert loss == (pytest.approx(0.05) if landed.index == 2 else 0), options

    landed = run_schedule(entries, PlanCache(target, "netem").apply, on_change=check)
    assert seen == [0, 1, 2] and len(landed) == 3
    _apply_in_place(bed, Profile())
