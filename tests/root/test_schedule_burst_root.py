"""Root tier: a schedule's thread ramps a link, then the sweep's next point changes it from the
sweep's thread (real netlink, real namespaces): the tbf's burst is decided from what the
kernel holds, whichever thread put it there.

The sweep's executor holds its sockets on this thread and shapes 10 mbit; a thread holding
sockets of its own (EmbeddedTestbed.schedule_thread) ramps the link to 1 gbit; the next point
(100 mbit) then comes from this thread under iperf3. 100 mbit's burst is smaller than 1 gbit's,
so the tbf must be deleted first: a 64 KB segment queued under 1 gbit's burst never gathers
100 mbit's tokens and the link stalls for good. Before, this thread decided from its own,
older record (10 mbit's burst) and shrank the burst in place.
"""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from netbench.emulation import changes as ch
from netbench.emulation.backends import plan_network
from netbench.emulation.changes import tbf_burst_bytes
from netbench.emulation.executor import real_executor
from netbench.model.profile import Profile
from netbench.testbed import netns as local
from tests.root.test_in_place_root import iperf_during

pytestmark = pytest.mark.root

MBIT = 1_000_000


def kernel_burst(netns: str, ifname: str) -> int:
    """The burst (bytes) of the tbf at the root of `ifname`, as the kernel reports it (tc -j)."""
    out = subprocess.run(["tc", "-n", netns, "-j", "qdisc", "show", "dev", ifname, "root"],
                         capture_output=True, text=True, check=True).stdout
    (root,) = [q for q in json.loads(out) if q.get("kind") == "tbf"]
    return int(root["options"]["burst"])


def test_the_next_point_after_a_schedule_threads_ramp_deletes_the_larger_burst_and_never_stalls(clean_machine):
    journal = clean_machine
    topology = local.up(2, journal)
    executor = real_executor(journal, hold=True)  # as a sweep's: its sockets held by this thread
    nodes = topology.nodes

    def apply(rate_bps: int) -> None:
        executor.apply(plan_network(Profile(name=f"r{rate_bps}", rate_bps=rate_bps), topology, "userspace",
                                    held=executor.held()))

    def ramp() -> None:
        try:
            with executor.qdiscs.holding():  # as EmbeddedTestbed.schedule_thread
                apply(100 * MBIT)
                apply(1000 * MBIT)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    errors: list[BaseException] = []
    try:
        apply(10 * MBIT)
        apply(10 * MBIT)  # this thread's record of each root, as a sweep's first points leave it
        thread = threading.Thread(target=ramp, name="schedule")
        thread.start()
        thread.join()
        assert errors == [], errors
        bursts = [kernel_burst(n.netns, n.ifname) for n in nodes]
        assert bursts == [tbf_burst_bytes(1000 * MBIT)] * 2, bursts
        intervals = iperf_during(lambda: apply(100 * MBIT), nodes[1].address, 6, 2.5, parallel=2)
        after = intervals[4:]  # from a second after the change to the end
        assert after and min(after) > 5e6, f"per-second rates: {[round(r / 1e6) for r in intervals]} Mbit/s"
        bursts = [kernel_burst(n.netns, n.ifname) for n in nodes]
        assert bursts == [tbf_burst_bytes(100 * MBIT)] * 2, bursts
    finally:
        executor.apply(ch.plan_clear(topology))
        executor.close()
        local.down(journal)
