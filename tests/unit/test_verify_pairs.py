"""netbench verify --all-pairs: the expected matrix (asymmetric pairs), the rounds, the tolerance,
the JSON record, the printed matrix and the exit status (pure: a fake ping runner)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import sys
import threading
import types

import pytest
from click.testing import CliRunner

from netbench.cli import common
from netbench.cli.app import main
from netbench.errors import UsageError
from netbench.experiment import verify as v
from netbench.experiment import verify_pairs as vp
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import Profile
from netbench.model.topology import plan_topology
from netbench.testbed import netns as local
from netbench.testbed import targets

TOPO = plan_topology(4, ipaddress.ip_network("10.213.0.0/24"))
N1, N2, N3, N4 = TOPO.nodes
NAMES = [n.name for n in TOPO.nodes]

# n1 -> n2 10 ms, n2 -> n1 20 ms; n1 -> n3 5 ms with loss and a rate and nothing back;
# n4 is in no link (unshaped both ways)
ASYM = PairTopology("asym", ("n1", "n2", "n3"), (
    PairLink("n1", "n2", Profile(delay_us=10_000)),
    PairLink("n1", "n3", Profile(delay_us=5_000, loss=0.01, rate_bps=100_000_000)),
    PairLink("n2", "n1", Profile(delay_us=20_000)),
))


def test_the_expected_matrix_adds_both_one_way_delays_of_an_asymmetric_pair():
    m = vp.expected_matrix(TOPO, ASYM, None)
    assert len(m) == 12 and all(src != dst for src, dst in m)
    there, back = m[("n1", "n2")], m[("n2", "n1")]
    assert (there.delay_there_us, there.delay_back_us, there.path.rtt_us) == (10_000, 20_000, 30_000)
    assert (back.delay_there_us, back.delay_back_us, back.path.rtt_us) == (20_000, 10_000, 30_000)
    assert there.path.crossings == 2 and there.path.rate_bps is None
    # the rate is the forward path's; the loss is the round trip's, whichever way it falls
    out, home = m[("n1", "n3")].path, m[("n3", "n1")].path
    assert (out.rtt_us, out.rate_bps, out.crossings) == (5_000, 100_000_000, 1)
    assert (home.rtt_us, home.rate_bps) == (5_000, None)
    assert out.loss_round_trip == home.loss_round_trip == pytest.approx(0.01)
    assert m[("n2", "n3")].path == m[("n4", "n1")].path == v.Expected(0, 0.0, None, 0)


def test_without_pairs_every_pair_is_the_single_profile_path():
    p = Profile(delay_us=7_000, rate_bps=50_000_000)
    m = vp.expected_matrix(TOPO, None, p)
    for (src, dst), e in m.items():
        assert e.path == v.expected_path(TOPO.node(src), p, TOPO.node(dst), p)
        assert (e.delay_there_us, e.delay_back_us, e.path.rtt_us) == (7_000, 7_000, 14_000)
    # profiles read back per node: n4 holds none, so a round trip with n4 crosses one point
    held = vp.expected_matrix(TOPO, None, {"n1": p, "n2": p, "n3": p, "n4": None})
    assert (held[("n1", "n4")].delay_there_us, held[("n1", "n4")].delay_back_us) == (7_000, 0)
    assert held[("n4", "n2")].path.rtt_us == 7_000


def test_a_topology_node_outside_the_testbed_is_refused():
    far = PairTopology("far", ("n1", "n9"), (PairLink("n1", "n9", Profile(delay_us=1_000)),), source="far.yaml")
    with pytest.raises(UsageError, match=r"far.yaml: node n9 is not in the testbed \(n1, n2, n3, n4\)"):
        vp.expected_matrix(TOPO, far, None)


def test_tolerance_is_a_floor_plus_a_share_and_parses_from_the_flag():
    assert vp.PAIRS_TOLERANCE.ms(100.0) == pytest.approx(2.5) and vp.PAIRS_TOLERANCE.ms(0.0) == 0.5
    assert v.Tolerance().ms(100.0) == pytest.approx(5.0)  # the single pair's: the larger of 0.5 ms, 5 %
    assert vp.parse_tolerance("0.5ms+2%") == vp.PAIRS_TOLERANCE
    assert vp.parse_tolerance("1ms") == v.Tolerance(1.0, 0.0, True)
    assert vp.parse_tolerance("3%") == v.Tolerance(0.0, 0.03, True)
    for bad in ("abc", "1ms+", "2"):
        with pytest.raises(UsageError, match="flag --tolerance: "):
            vp.parse_tolerance(bad)
    e = v.Expected(rtt_us=100_000, loss_round_trip=0.0, rate_bps=None, crossings=2)
    rtt = {got: vp.compare_pairs({("a", "b"): vp.PairExpected("a", "b", 50_000, 50_000, e)},
                                 {("a", "b"): measured(got)})[("a", "b")][0] for got in (102.4, 102.6, 97.6)}
    assert (rtt[102.4].ok, rtt[102.6].ok, rtt[97.6].ok) == (True, False, True)
    assert "2.50 ms" in rtt[102.4].rule


def test_rounds_cover_every_ordered_pair_once_and_each_node_sends_and_answers_one_stream_per_round():
    rounds = vp.ping_rounds(NAMES)
    assert len(rounds) == 3
    flat = [pair for r in rounds for pair in r]
    assert sorted(flat) == sorted((s, d) for s in NAMES for d in NAMES if s != d)
    for r in rounds:
        assert sorted(s for s, _ in r) == NAMES and sorted(d for _, d in r) == NAMES
    assert vp.ping_rounds(["n1"]) == []


def measured(rtt_ms, sent=50, received=50):
    return v.Measured(rtt_ms * 1000, rtt_ms * 1000, rtt_ms * 1000, sent, received, None, None)


class FakeNet:
    """Answers pings with the configured RTT of `truth` (a PairTopology) plus `extra_ms`;
    records how many pings and iperf3 tests were in flight at once."""

    def __init__(self, truth, extra_ms=0.1, rate_bps=None):
        self.expected = vp.expected_matrix(TOPO, truth, None)
        self.extra_ms, self.rate_bps = extra_ms, rate_bps
        self.lock = threading.Lock()
        self.in_flight = self.most_pings = self.most_iperf = 0
        self.pinged, self.iperfed = [], []
        self.barrier = threading.Barrier(4, timeout=5)

    def ping(self, src, dst, settings):
        assert settings.iperf_seconds == 0
        with self.lock:
            self.in_flight += 1
            self.most_pings = max(self.most_pings, self.in_flight)
            self.pinged.append((src.name, dst.name))
        self.barrier.wait()  # the four pings of a round meet: they run at once
        with self.lock:
            self.in_flight -= 1
        return measured(self.expected[(src.name, dst.name)].path.rtt_us / 1000 + self.extra_ms,
                        sent=settings.ping_count, received=settings.ping_count)

    def iperf(self, src, dst, seconds):
        with self.lock:
            self.in_flight += 1
            self.most_iperf = max(self.most_iperf, self.in_flight)
        self.iperfed.append((src.name, dst.name))
        with self.lock:
            self.in_flight -= 1
        rate = self.rate_bps or 1e9
        return rate * 0.97, rate


def test_measure_all_pairs_runs_a_round_at_once_and_throughput_one_pair_at_a_time():
    net = FakeNet(ASYM)
    rounds = []
    got = vp.measure_all_pairs(TOPO, v.Settings(ping_count=10, iperf_seconds=1.0), pinger=net.ping,
                               throughput=net.iperf, on_round=lambda done, total: rounds.append((done, total)))
    assert list(got) == [(s, d) for s in NAMES for d in NAMES if s != d]
    assert sorted(net.pinged) == sorted(got) and net.most_pings == 4 and rounds == [(1, 3), (2, 3), (3, 3)]
    assert sorted(net.iperfed) == sorted(got) and net.most_iperf == 1
    assert got[("n1", "n2")].rtt_mean_us == pytest.approx(30_100) and got[("n1", "n2")].wire_rate_bps == 1e9
    only = FakeNet(ASYM)
    vp.measure_all_pairs(TOPO, v.Settings(ping_count=10, iperf_seconds=1.0), throughput_pairs=[("n1", "n3")],
                         pinger=only.ping, throughput=only.iperf)
    assert only.iperfed == [("n1", "n3")]


def test_verify_all_pairs_record_is_json_and_names_the_pairs_out_of_tolerance():
    net = FakeNet(ASYM)
    record = vp.verify_all_pairs(TOPO, ASYM, None, pinger=net.ping)
    assert record["ok"] and record["failed"] == [] and record["nodes"] == NAMES
    assert json.loads(json.dumps(record)) == record
    cell = record["matrix"]["n1"]["n2"]
    assert cell["expected"]["delay_there_us"] == 10_000 and cell["expected"]["delay_back_us"] == 20_000
    assert cell["expected"]["rtt_us"] == 30_000 and cell["measured"]["pings_sent"] == 50
    assert [c["metric"] for c in cell["checks"]] == ["rtt", "loss", "rate"] and cell["ok"]
    assert record["topology"] == {"name": "asym", "source": "", "scale": 1.0}
    assert record["tolerance"]["rule"] == "0.5 ms + 2 %" and "n1" not in record["matrix"]["n1"]
    # the link really is the other way round: n1 -> n2 20 ms, n2 -> n1 10 ms: same RTT, passes;
    # a link that is 5 ms farther both ways fails on both directions of that pair only
    farther = FakeNet(ASYM)
    farther.expected[("n1", "n2")] = farther.expected[("n2", "n1")] = vp.PairExpected(
        "n1", "n2", 15_000, 25_000, v.Expected(40_000, 0.0, None, 2))
    record = vp.verify_all_pairs(TOPO, ASYM, None, pinger=farther.ping)
    assert not record["ok"] and record["failed"] == ["n1->n2", "n2->n1"]
    assert record["matrix"]["n1"]["n2"]["checks"][0]["error"] == pytest.approx(10.1)
    # throughput only where a rate is configured unless unshaped_rate
    rated = FakeNet(ASYM, rate_bps=100_000_000)
    vp.verify_all_pairs(TOPO, ASYM, None, v.Settings(ping_count=10, iperf_seconds=1.0, unshaped_rate=False),
                        pinger=rated.ping, throughput=rated.iperf)
    assert rated.iperfed == [("n1", "n3")]


def test_the_printed_matrix_shows_measured_configured_and_error_and_marks_failures(capsys):
    from netbench.cli import render_pairs

    truth = FakeNet(ASYM)
    truth.expected[("n1", "n2")] = vp.PairExpected("n1", "n2", 15_000, 25_000, v.Expected(40_000, 0.0, None, 2))
    record = vp.verify_all_pairs(TOPO, ASYM, None, pinger=truth.ping)
    render_pairs.pairs_matrix(record)
    out = capsys.readouterr().out
    assert "40.10 / 30.00 (+10.10) !" in out  # n1 -> n2: out of tolerance
    assert "30.10 / 30.00 (+0.10)" in out and "30.10 / 30.00 (+0.10) !" not in out  # n2 -> n1
    assert "5.10 / 5.00 (+0.10)" in out and "0.10 / 0.00 (+0.10)" in out
    assert "n1 -> n2 rtt: mean RTT within 1.10 ms" in out
    assert "1 of 12 pairs out of tolerance: n1->n2" in " ".join(out.split())


# ---------------------------------------------------------------- the command

class FakeTarget:
    held_pairs = None  # every node holds one profile: no per-pair shaping

    def __init__(self, held):
        self.held = held

    def show(self):
        return {"nodes": [{"node": n.name, "profile": self.held} for n in TOPO.nodes]}


@pytest.fixture
def testbed(monkeypatch):
    """A 4-node testbed holding 10 ms on every egress (read back), pings answered by a fake."""
    monkeypatch.setattr(common, "require_root", lambda: None)
    monkeypatch.setattr(local, "discover", lambda: TOPO)
    target = FakeTarget({"name": "active", "delay": "10ms", "jitter": "0us", "loss": "0%"})

    @contextlib.contextmanager
    def open_target(inventory=None, insecure_host_keys=False, **kwargs):
        yield target

    monkeypatch.setattr(targets, "open_target", open_target)
    state = {"rtt_ms": 20.2, "pinged": []}

    def ping(src, dst, settings):
        state["pinged"].append((src.name, dst.name, settings.ping_count))
        return measured(state["rtt_ms"], sent=settings.ping_count, received=settings.ping_count)

    monkeypatch.setattr(vp, "_ping", ping)
    return state


def invoke(*args):
    return CliRunner().invoke(main, ["verify", *args], terminal_width=300)


def test_all_pairs_passes_against_the_profiles_read_back(testbed):
    result = invoke("--all-pairs")
    assert result.exit_code == 0, result.output
    assert len(testbed["pinged"]) == 12 and {c for _, _, c in testbed["pinged"]} == {50}
    assert "20.20 / 20.00 (+0.20)" in result.output and "all 12 pairs within tolerance" in result.output


def test_all_pairs_json_and_the_exit_status_follow_the_verdict(testbed):
    testbed["rtt_ms"] = 21.0  # 1 ms off: beyond 0.5 ms + 2 % of 20 ms (0.9 ms)
    result = invoke("--all-pairs", "--json", "--count", "20")
    assert result.exit_code == 1
    record = json.loads(result.stdout)
    assert record["ok"] is False and len(record["failed"]) == 12 and record["settings"]["ping_count"] == 20
    assert invoke("--all-pairs", "--json", "--tolerance", "1.5ms").exit_code == 0


def test_all_pairs_with_a_topology_expects_that_matrix(testbed, monkeypatch, tmp_path):
    loaded = []

    def load(path):
        loaded.append(path)
        return ASYM

    monkeypatch.setitem(sys.modules, "netbench.model.pairs_file", types.SimpleNamespace(load_pair_topology=load))
    result = invoke("--all-pairs", "--topology", str(tmp_path / "asym.yaml"))
    assert loaded == [tmp_path / "asym.yaml"]
    assert result.exit_code == 1  # 20.2 ms everywhere is not the asymmetric matrix
    assert "20.20 / 30.00 (-9.80) !" in result.output and "topology asym" in result.output


@pytest.mark.parametrize("args, message", [
    (["--all-pairs", "--from", "n1"], "flag --from: not with --all-pairs"),
    (["--throughput"], "flag --throughput: only with --all-pairs"),
    (["--topology", "t.yaml"], "flag --topology: only with --all-pairs"),
    (["--all-pairs", "--tolerance", "lots"], "flag --tolerance: 'lots'"),
])
def test_all_pairs_flags_are_refused_where_they_do_not_apply(testbed, args, message):
    result = invoke(*args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert testbed["pinged"] == []


def test_the_throughput_matrix_shows_rates_to_three_figures(capsys):
    from netbench.cli import render_pairs

    net = FakeNet(ASYM, rate_bps=100_000_000)
    record = vp.verify_all_pairs(TOPO, ASYM, None, v.Settings(ping_count=10, iperf_seconds=1.0),
                                 pinger=net.ping, throughput=net.iperf)
    render_pairs.pairs_matrix(record)
    out = capsys.readouterr().out
    assert "throughput src -> dst" in out and "100mbit / 100mbit (+0.0%)" in out  # n1 -> n3, rated
    assert out.count("100mbit") == 12 + 1  # every measured pair, and n1 -> n3's configured rate


def test_a_sweeps_verify_of_a_topology_point_measures_every_pair(monkeypatch):
    from types import SimpleNamespace

    topo = plan_topology(3, ipaddress.ip_network("10.213.0.0/24"))
    far = PairTopology(name="t", nodes=("n1", "n2", "n3"),
                       links=(PairLink("n1", "n3", Profile(name="f", delay_us=20_000)),
                              PairLink("n3", "n1", Profile(name="f", delay_us=20_000))))
    seen = {}

    def fake(topology, pairs, profile, settings):
        seen.update(pairs=pairs, settings=settings)
        return {"matrix": {"n1": {"n2": {}, "n3": {}}, "n2": {"n1": {}}}, "failed": ["n1->n3"], "ok": False}

    monkeypatch.setattr(vp, "verify_all_pairs", fake)
    notes = []
    record = vp.verify_pairs_point(SimpleNamespace(run_id="r000", pairs=far), topo,
                                   SimpleNamespace(note=notes.append))
    assert seen["pairs"] is far and seen["settings"] == vp.PAIRS_SETTINGS and record["ok"] is False
    assert notes == ["r000: verify 3 pairs, out of tolerance: n1->n3"]
