"""Root tier: the metrics' network reader on a real testbed (no TensorFlow)."""

from __future__ import annotations

import subprocess
import time

import pytest

from netbench.emulation import backends
from netbench.emulation.executor import real_executor
from netbench.metrics.network import NetworkReader
from netbench.model.profile import Profile
from netbench.testbed import netns as local

pytestmark = [pytest.mark.root]


def test_reader_sees_interfaces_qdiscs_and_engines_of_a_real_testbed(clean_machine, state_dir):
    topo = local.up(2, clean_machine)
    real_executor(clean_machine, detach_engines=True).apply(
        backends.plan_apply(Profile(name="t", delay_us=2_000, rate_bps=50_000_000), topo, "userspace"))
    n1, n2 = topo.nodes
    reader = NetworkReader(state_dir, cache_s=0, topology=topo)
    before = {(i.node, i.interface): i for i in reader.sample().interfaces}
    subprocess.run(["ip", "netns", "exec", n1.netns, "ping", "-c", "5", "-i", "0.05", "-s", "1000", n2.address],
                   check=True, capture_output=True, timeout=30)
    time.sleep(1.2)  # engines rewrite their stats about once a second
    sample = reader.sample()
    after = {(i.node, i.interface): i for i in sample.interfaces}
    assert set(after) == {("n1", "eth0"), ("n2", "eth0")}
    assert after["n1", "eth0"].tx_packets - before["n1", "eth0"].tx_packets >= 5
    assert after["n1", "eth0"].tx_bytes - before["n1", "eth0"].tx_bytes >= 5 * 1000
    assert after["n2", "eth0"].rx_packets - before["n2", "eth0"].rx_packets >= 5
    assert {(q.node, q.interface) for q in sample.qdiscs} == {("n1", "eth0"), ("n2", "eth0")}  # the tbf
    engines = {e.node: e for e in sample.engines}
    assert set(engines) == {"n1", "n2"} and all(e.up for e in engines.values())
    assert engines["n1"].received >= 5
    assert sample.read_errors == 0


def test_reader_never_creates_a_missing_namespace(clean_machine, state_dir):
    """pyroute2 creates a namespace it is asked to enter unless told not to; a scrape during
    teardown must not bring a node back."""
    topo = local.up(1, clean_machine)
    reader = NetworkReader(state_dir, cache_s=0, topology=topo)
    assert len(reader.sample().interfaces) == 1
    local.down(clean_machine)
    try:
        sample = reader.sample()
        assert sample.interfaces == () and sample.read_errors == 1
        assert local.list_netbench_netns() == []
    finally:
        for name in local.list_netbench_netns():  # only if the reader made one: the test failed
            subprocess.run(["ip", "netns", "delete", name], check=False)
