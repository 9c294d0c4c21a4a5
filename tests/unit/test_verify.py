"""netbench verify: the expected path from profiles, the comparison, ping parsing (pure)."""

from __future__ import annotations

import ipaddress

import pytest

from netbench import stats
from netbench.experiment import verify as v
from netbench.errors import NetbenchError
from netbench.model.profile import Profile
from netbench.model.topology import plan_topology

TOPO = plan_topology(3, ipaddress.ip_network("10.213.0.0/24"))
N1, N2, N3 = TOPO.nodes


def test_egress_on_both_nodes_crosses_two_shaped_points():
    p = Profile(delay_us=10_000, loss=0.01, rate_bps=100_000_000)
    e = v.expected_path(N1, p, N2, p)
    assert (e.rtt_us, e.crossings, e.rate_bps) == (20_000, 2, 100_000_000)
    assert e.loss_round_trip == pytest.approx(1 - 0.99 ** 2)


def test_both_directions_double_the_crossings_and_ingress_alone_counts_once_each_way():
    both = Profile(delay_us=2_000, loss=0.1, direction="both", rate_bps=50_000_000)
    e = v.expected_path(N1, both, N2, both)
    assert (e.rtt_us, e.crossings, e.rate_bps) == (8_000, 4, 50_000_000)
    assert e.loss_round_trip == pytest.approx(1 - 0.9 ** 4)
    ingress = Profile(delay_us=3_000, direction="ingress", rate_bps=10_000_000)
    e = v.expected_path(N1, ingress, N2, None)  # only n1's ingress: the reply path
    assert (e.rtt_us, e.crossings, e.rate_bps) == (3_000, 1, None)


def test_peers_shape_only_traffic_to_them():
    to_n3 = Profile(delay_us=5_000, peers=(f"{N3.address}/32",))
    assert v.expected_path(N1, to_n3, N2, to_n3).crossings == 0
    e = v.expected_path(N1, to_n3, N3, to_n3)
    assert (e.crossings, e.rtt_us) == (1, 5_000)  # n3 shapes nothing toward n1


def test_unshaped_path_and_gilbert_elliott_long_run_loss():
    assert v.expected_path(N1, None, N2, Profile()) == v.Expected(0, 0.0, None, 0)
    ge = Profile(delay_us=1_000, loss_model="gilbert-elliott", ge_p=0.01, ge_r=0.09, ge_bad_loss=0.5,
                 ge_good_loss=0.0)
    e = v.expected_path(N1, ge, N2, None)
    assert e.loss_round_trip == pytest.approx(0.1 * 0.5)  # 10 % of the time bad, half lost there


def test_wilson_interval_matches_the_formula_at_the_edges():
    lo, hi = stats.wilson_interval(0, 100)
    z2 = 2.5758293035489004 ** 2
    assert lo == 0.0 and hi == pytest.approx(z2 / (100 + z2))
    lo, hi = stats.wilson_interval(50, 100)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)


def measured(rtt_ms=None, sent=100, received=100, wire=None):
    return v.Measured(None if rtt_ms is None else rtt_ms * 1000, None, None, sent, received, wire, wire)


def by_metric(checks):
    return {c.metric: c for c in checks}


def test_compare_judges_rtt_loss_and_rate():
    e = v.Expected(rtt_us=20_000, loss_round_trip=0.0, rate_bps=100_000_000, crossings=2)
    good = by_metric(v.compare(e, measured(20.4, wire=97_000_000)))
    assert good["rtt"].ok and good["rtt"].error == pytest.approx(0.4)
    assert good["loss"].ok and good["rate"].ok and good["rate"].error == pytest.approx(-0.03)
    assert v.passed(list(good.values()))
    bad = by_metric(v.compare(e, measured(35.0, received=90, wire=60_000_000)))
    assert bad["rtt"].ok is False and bad["loss"].ok is False and bad["rate"].ok is False
    assert not v.passed(list(bad.values()))


def test_rate_is_recorded_but_not_judged_under_loss_or_when_unset():
    lossy = v.Expected(rtt_us=2_000, loss_round_trip=0.02, rate_bps=100_000_000, crossings=2)
    rate = by_metric(v.compare(lossy, measured(2.0, received=98, wire=30_000_000)))["rate"]
    assert rate.ok is None and rate.measured == 30_000_000 and "not judged" in rate.rule
    unset = by_metric(v.compare(v.Expected(0, 0.0, None, 0), measured(0.1, wire=9e9)))["rate"]
    assert unset.ok is None and unset.configured is None


def test_configured_loss_inside_the_interval_passes():
    e = v.Expected(rtt_us=0, loss_round_trip=0.02, rate_bps=None, crossings=2)
    assert by_metric(v.compare(e, measured(0.1, sent=200, received=195)))["loss"].ok  # 2.5 % seen
    assert not by_metric(v.compare(e, measured(0.1, sent=200, received=170)))["loss"].ok  # 15 % seen


PING = """PING 10.213.0.2 (10.213.0.2) 56(84) bytes of data.
64 bytes from 10.213.0.2: icmp_seq=1 ttl=64 time=20.4 ms
64 bytes from 10.213.0.2: icmp_seq=2 ttl=64 time=21.0 ms
64 bytes from 10.213.0.2: icmp_seq=2 ttl=64 time=21.2 ms (DUP!)
64 bytes from 10.213.0.2: icmp_seq=4 ttl=64 time=19.8 ms

--- 10.213.0.2 ping statistics ---
4 packets transmitted, 3 received, +1 duplicates, 25% packet loss, time 3004ms
"""


def test_parse_ping_skips_duplicates():
    sent, received, times = v.parse_ping(PING)
    assert (sent, received) == (4, 3) and times == pytest.approx([20_400, 21_000, 19_800])
    with pytest.raises(NetbenchError, match="no summary"):
        v.parse_ping("connect: Network is unreachable")


def test_the_exact_interval_matches_its_closed_forms_and_keeps_rare_losses_consistent():
    # none lost of n: the upper bound solves (1 - p)^n = alpha / 2; all lost, the mirror
    lo, hi = stats.clopper_pearson_interval(0, 50, 0.99)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.005 ** (1 / 50), rel=1e-9)
    lo, hi = stats.clopper_pearson_interval(50, 50, 0.99)
    assert hi == 1.0 and lo == pytest.approx(0.005 ** (1 / 50), rel=1e-9)
    # one lost: the lower bound solves 1 - (1 - p)^n = alpha / 2
    lo, hi = stats.clopper_pearson_interval(1, 50, 0.99)
    assert lo == pytest.approx(1 - 0.995 ** (1 / 50), rel=1e-6)
    assert lo < 0.002 < hi  # one ping of 50 lost is consistent with 0.1 % each way
    assert stats.wilson_interval(1, 50, 0.99)[0] > 0.002  # which Wilson's interval rejected
    lo, hi = stats.clopper_pearson_interval(30, 100, 0.95)
    assert (lo, hi) == (pytest.approx(0.2124, abs=1e-4), pytest.approx(0.3998, abs=1e-4))
    assert stats.clopper_pearson_interval(3, 0) == (0.0, 1.0)
