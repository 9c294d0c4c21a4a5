"""Apply then read back round-trips every profile field through netem's netlink encoding.

Pure: the fake qdisc adapter keeps what the kernel would, by encoding the options with
netbench's netem message class and decoding them from the bytes as a dump would be
decoded. tests/kernel/test_netem_kernel.py runs the same property against a real kernel.
"""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from tests.fakes.netlink import make_fakes
from tests.netem_checks import kernel_view
from tests.strategies import valid_profiles

from netbench.emulation import backends, changes as ch
from netbench.emulation.executor import Executor, read_emulation, recorded_distributions
from netbench.emulation.netlink.netem import NetemParams, options
from netbench.state.journal import Journal
from netbench.model.profile import Profile, profile_from_mapping
from netbench.model.topology import plan_topology

TOPO = plan_topology(2, ipaddress.ip_network("10.213.0.0/24"))


def applied_and_read(profile: Profile, state_dir) -> list[dict]:
    journal = Journal(state_dir)
    qdiscs, iptables, engines, _ = make_fakes()
    Executor(journal=journal, qdiscs=qdiscs, iptables=iptables, engines=engines).apply(
        backends.plan_apply(profile, TOPO, "netem"))
    return read_emulation(TOPO, qdiscs, iptables, engines, recorded_distributions(journal))


@settings(max_examples=150, deadline=None)
@given(valid_profiles())
def test_every_field_round_trips(tmp_path_factory, profile):
    rows = applied_and_read(profile, tmp_path_factory.mktemp("state"))
    for index, row in enumerate(rows):
        if profile.is_null or (profile.peers and not ch.resolve_peers(profile, TOPO, TOPO.nodes[index])):
            assert row["profile"] is None
            continue
        back = profile_from_mapping(row["profile"], "read-back")
        assert kernel_view(back) == kernel_view(profile, TOPO, index)


def test_a_change_leaves_nothing_of_the_old_profile(tmp_path):
    rich = Profile(delay_us=20_000, jitter_us=5_000, jitter_correlation=0.5, distribution="pareto",
                   loss_model="gilbert-elliott", ge_p=0.02, ge_r=0.3, duplicate=0.1, duplicate_correlation=0.2,
                   corrupt=0.05, reorder=0.25, reorder_gap=3, rate_bps=10**8, limit_packets=50)
    plain = Profile(delay_us=1_000)
    journal = Journal(tmp_path)
    qdiscs, iptables, engines, _ = make_fakes()
    ex = Executor(journal=journal, qdiscs=qdiscs, iptables=iptables, engines=engines)
    ex.apply(backends.plan_apply(rich, TOPO, "netem"))
    ex.apply(backends.plan_apply(plain, TOPO, "netem"))
    row = read_emulation(TOPO, qdiscs, iptables, engines, recorded_distributions(journal))[0]
    assert row["qdisc"]["live_change"]
    assert kernel_view(profile_from_mapping(row["profile"], "read-back")) == kernel_view(plain, TOPO)


def test_every_attribute_is_sent_even_when_zero():
    attrs = [name for name, _ in options(NetemParams())["attrs"]]
    assert attrs == ["TCA_NETEM_CORR", "TCA_NETEM_DELAY_DIST", "TCA_NETEM_REORDER", "TCA_NETEM_CORRUPT",
                     "TCA_NETEM_RATE", "TCA_NETEM_LATENCY64", "TCA_NETEM_JITTER64"]


def test_random_loss_sends_no_loss_model_and_gilbert_elliott_sends_one():
    # netem_change() goes back to random loss only when TCA_NETEM_LOSS is absent: an empty
    # attribute kept a Gilbert-Elliott model through a live change (make test-kernel)
    random_loss = [name for name, _ in options(NetemParams(loss=0.01))["attrs"]]
    ge = dict(options(NetemParams(ge=(0.01, 0.3, 0.9, 0.001)))["attrs"])
    assert "TCA_NETEM_LOSS" not in random_loss
    assert [name for name, _ in ge["TCA_NETEM_LOSS"]["attrs"]] == ["NETEM_LOSS_GE"]


def test_rate_beyond_32_bits_is_sent_as_rate64():
    sent = dict((name, value) for name, value in options(NetemParams(rate_bps=50 * 10**9))["attrs"])
    assert sent["TCA_NETEM_RATE"]["rate"] == 2**32 - 1
    assert sent["TCA_NETEM_RATE64"] == 50 * 10**9 // 8


ENCODE_AFTER_PYROUTE2 = """
import struct
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg import sched_netem

# what any pyroute2 tc call does first: compile tcmsg's attribute map
plain = tcmsg()
plain["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", sched_netem.get_parameters({"delay": 1000})]]
plain.encode()

from netbench.emulation.netlink import netem
msg = netem.netem_tcmsg()
msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", netem.options(netem.NetemParams(delay_us=10_000,
                 jitter_us=2_000, distribution="normal"))]]
msg.encode()
data = bytes(msg.data)
offset = 16 + 20 + 12  # nlmsghdr, struct tcmsg, TCA_KIND ("netem" padded to 12)
length, kind = struct.unpack_from("=HH", data, offset)
assert kind == 2, kind  # TCA_OPTIONS
offset += 4 + 24  # its header, then struct tc_netem_qopt
while offset < len(data):
    alen, atype = struct.unpack_from("=HH", data, offset)
    if atype == 2:  # TCA_NETEM_DELAY_DIST
        print(alen - 4)
        break
    offset += (alen + 3) & ~3
"""


def test_distribution_table_survives_an_earlier_pyroute2_tc_call():
    """pyroute2 caches compiled attribute maps on the class and subclasses inherit the cache:
    a netem message built after any pyroute2 tc call lost its table. Needs a fresh process,
    since the order of compilation is what matters."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", ENCODE_AFTER_PYROUTE2], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) == 2 * 4096, out.stdout + out.stderr
