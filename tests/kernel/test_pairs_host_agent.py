"""A host's row of a per-pair topology through the host agent on a real kernel (`make
test-kernel`): the controller's plan for one inventory host (remote.plan_hosts), sent as JSON to
`netbench node apply` running in a namespace that stands in for the host, every destination's
class, netem leaf and filter read back with `tc -j`, then `netbench node show --json` read back
by the controller (remote/pairs.hosts_pairs) to the topology's row, and `node reset` leaving
nothing. (tests/ssh/test_remote_pairs_sshd.py drives the same over SSH.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest
from tests.kernel.test_pairs_kernel import tc_pairs

from netbench.emulation import wire
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import profile_from_mapping
from netbench.remote import controller as remote
from netbench.remote.inventory import inventory_from_mapping
from netbench.remote.pairs import hosts_pairs

pytestmark = [pytest.mark.root, pytest.mark.netem]

ADDRESSES = {"h1": "10.252.0.11", "h2": "10.252.0.12", "h3": "10.252.0.13"}
INV = inventory_from_mapping({"defaults": {"interface": "data0"},
                              "hosts": {name: {"ssh": f"10.251.0.{11 + i}", "tf_address": address}
                                        for i, (name, address) in enumerate(ADDRESSES.items())}}, "inv.yaml")
NEAR = profile_from_mapping({"delay": "2ms"}, "t")
FAR = profile_from_mapping({"delay": "25ms", "rate": "100mbit"}, "t")


def three():
    links = tuple(PairLink(s, d, NEAR if {s, d} == {"h1", "h2"} else FAR)
                  for s in ADDRESSES for d in ADDRESSES if s != d)
    return PairTopology("three", tuple(ADDRESSES), links)


def run(*argv, netns=None, input=None):
    """`argv` in `netns`'s network namespace only (nsenter, not `ip netns exec`, whose private
    mount namespace would drop the agent's /run/netns attach when the command exits; a real
    host's agent runs in the host's own mount namespace)."""
    full = ["nsenter", f"--net=/run/netns/{netns}", *argv] if netns else list(argv)
    result = subprocess.run(full, capture_output=True, text=True, input=input, timeout=120)
    assert result.returncode == 0, (full, result.stdout, result.stderr)
    return result.stdout


def test_a_hosts_row_applies_through_its_agent_and_reads_back(netem_kernel, tmp_path):
    netns, state = f"nbk-host-{uuid.uuid4().hex[:6]}", tmp_path / "state"
    node = [sys.executable, "-m", "netbench.cli", "node", "--state-dir", str(state)]
    planned = remote.plan_hosts(INV, {h.name: {"backend": "netem"} for h in INV.hosts}, three(), None)
    run("ip", "netns", "add", netns)
    try:
        run("ip", "link", "add", "data0", "type", "dummy", netns=netns)
        run("ip", "addr", "add", "10.252.0.11/24", "dev", "data0", netns=netns)
        run("ip", "link", "set", "data0", "up", netns=netns)
        answer = json.loads(run(*node, "apply", "--json", "--lease", "0", "--force", netns=netns,
                                input=wire.plan_to_json(planned.plans["h1"])))
        assert answer["applied"]
        shaped, _, _ = tc_pairs(SimpleNamespace(netns=netns, ifname="data0"))
        assert {address: (delay, rate) for address, (_, delay, rate) in shaped.items()} == {
            "10.252.0.12": (pytest.approx(0.002), shaped["10.252.0.12"][2]), "10.252.0.13": (pytest.approx(0.025),
                                                                                               100_000_000)}
        shown = json.loads(run(*node, "show", "--json", "--interface", "data0", netns=netns))
        held = hosts_pairs({"h1": shown}, remote.hosts_topology(INV))
        assert [(link.src, link.dst, link.profile.delay_us, link.profile.rate_bps) for link in held.links] == [
            ("h1", "h2", 2_000, None), ("h1", "h3", 25_000, 100_000_000)]
        removed = json.loads(run(*node, "reset", "--json", netns=netns))["removed"]
        assert removed and not any(q.get("kind") in ("htb", "netem") for q in json.loads(
            run("tc", "-j", "qdisc", "show", "dev", "data0", netns=netns) or "[]"))
    finally:
        subprocess.run([*node, "reset", "--json"], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
