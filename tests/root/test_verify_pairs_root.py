"""Root tier: `netbench verify --all-pairs` pings every ordered pair of a real 4-node testbed
holding one profile (userspace backend here, netem on a netem kernel) and compares the
matrix with the profiles read back, or with a per-pair expectation that is not what the
link holds."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

from netbench.emulation import backends
from netbench.emulation.executor import choose_backend, real_executor
from netbench.experiment import verify as v
from netbench.experiment import verify_pairs as vp
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import Profile
from netbench.testbed import netns as local
from tests.conftest import NETBENCH

pytestmark = pytest.mark.root

NAMES = ("n1", "n2", "n3", "n4")


def _four_nodes_at_2ms(journal):
    topo = local.up(4, journal)
    real_executor(journal).apply(backends.plan_apply(Profile(delay_us=2_000), topo, choose_backend(None).name))
    return topo


def test_all_pairs_passes_against_the_profile_applied(clean_machine):
    _four_nodes_at_2ms(clean_machine)
    result = subprocess.run([*NETBENCH, "verify", "--all-pairs", "--json", "--count", "30"],
                            capture_output=True, text=True, timeout=180)
    record = json.loads(result.stdout)
    cells = [(src, dst, cell) for src, row in record["matrix"].items() for dst, cell in row.items()]
    assert sorted((s, d) for s, d, _ in cells) == sorted((s, d) for s in NAMES for d in NAMES if s != d)
    for src, dst, cell in cells:
        assert (cell["expected"]["delay_there_us"], cell["expected"]["delay_back_us"]) == (2_000, 2_000)
        assert cell["measured"]["pings_sent"] == 30 and cell["measured"]["pings_received"] == 30
    assert record["failed"] == [] and result.returncode == 0, (record["failed"], result.stderr)


def test_a_wrong_per_pair_expectation_fails_on_that_pair_only(clean_machine):
    topo = _four_nodes_at_2ms(clean_machine)
    # claimed: every pair 2 ms each way, except n1 <-> n3 at 10 ms; the link holds 2 ms everywhere
    links = tuple(PairLink(s, d, Profile(delay_us=10_000 if {s, d} == {"n1", "n3"} else 2_000))
                  for s in NAMES for d in NAMES if s != d)
    claimed = PairTopology("claimed", NAMES, links)
    record = vp.verify_all_pairs(topo, claimed, None, v.Settings(ping_count=20, iperf_seconds=0.0))
    assert record["failed"] == ["n1->n3", "n3->n1"] and record["ok"] is False
    rtt = record["matrix"]["n1"]["n3"]["checks"][0]
    assert rtt["configured"] == 20.0 and rtt["measured"] < 10.0 and rtt["ok"] is False


@pytest.mark.skipif(importlib.util.find_spec("netbench.model.pairs_file") is None,
                    reason="no topology file loader (netbench/model/pairs_file.py) yet")
def test_all_pairs_with_a_wrong_topology_file_exits_non_zero(clean_machine, tmp_path):
    _four_nodes_at_2ms(clean_machine)
    path = tmp_path / "far.yaml"
    path.write_text("name: far\ngroups:\n  us: [n1, n2]\n  eu: [n3, n4]\nlinks:\n"
                    "  us: {delay: 2ms}\n  eu: {delay: 2ms}\n  us-eu: {delay: 25ms}\n")
    result = subprocess.run([*NETBENCH, "verify", "--all-pairs", "--json", "--count", "20", "--topology", str(path)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr
    record = json.loads(result.stdout)
    far = {f"{s}->{d}" for s in ("n1", "n2") for d in ("n3", "n4")}
    assert set(record["failed"]) == far | {f"{d}->{s}" for s, d in (p.split("->") for p in far)}
    assert record["matrix"]["n1"]["n3"]["expected"]["rtt_us"] == 50_000
