"""Root tier: changes made from a thread other than the one that made the executor (a sweep's
schedule runs on a thread of its own) land, and what they start outlives that thread.

A sweep's executor (real_executor(hold=True), engines tied to the controller's life) is made
on this thread; a short-lived thread then adds a delay to the rate-only link and changes its
rate: real netlink and a delay engine started from that thread. Before, the netlink part
raised pyroute2's "calling #use_socket from another thread", and an engine started from the
thread was killed as the thread returned (PR_SET_PDEATHSIG follows the forking thread), its
NFQUEUE rule left dropping every packet of the node. An engine that dies is reported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from netbench.emulation import changes as ch
from netbench.emulation.backends import plan_network
from netbench.emulation.executor import real_executor
from netbench.model.profile import Profile
from netbench.testbed import netns as local
from tests.conftest import engine_pids
from tests.unit.test_netlink_roots import errors_in_thread

pytestmark = pytest.mark.root


def _in_thread(work) -> list[BaseException]:
    return errors_in_thread(work, name="short-lived")


def test_a_change_from_a_short_lived_thread_lands_and_its_engines_outlive_the_thread(clean_machine):
    journal = clean_machine
    topology = local.up(2, journal)
    executor = real_executor(journal, hold=True)  # as a sweep's: made here, engines die with us

    def apply(profile: Profile) -> None:
        executor.apply(plan_network(profile, topology, "userspace", held=executor.held()))

    try:
        apply(Profile(name="base", rate_bps=100_000_000))  # rate only: no engine yet
        assert engine_pids() == set()
        errors = _in_thread(lambda: apply(Profile(name="spike", delay_us=20_000, rate_bps=50_000_000)))
        assert errors == [], errors
        time.sleep(1.0)  # a parent-death signal arrives as the thread exits
        engines = engine_pids()
        assert len(engines) == 2, engines
        for position, node in enumerate(topology.nodes):
            tree = executor.qdiscs.read(node.netns, node.ifname)
            assert tree is not None and tree["rate_bps"] == 50_000_000, tree
            engine = executor.engines.read(topology.switch_netns, ch.queue_num(position))
            assert engine is not None and engine["alive"], engine
        ping = subprocess.run(["ip", "netns", "exec", topology.nodes[0].netns, "ping", "-n", "-c", "3", "-i", "0.2",
                               "-W", "2", topology.nodes[1].address], capture_output=True, text=True, timeout=30)
        assert ping.returncode == 0, ping.stdout + ping.stderr  # nothing dropped by an orphaned rule
        # a second change from another thread: the engines are reconfigured, not restarted
        errors = _in_thread(lambda: apply(Profile(name="back", delay_us=5_000, rate_bps=100_000_000)))
        assert errors == [], errors
        time.sleep(0.5)
        assert engine_pids() == engines and executor.lost() == []
        # an engine that dies mid-run is reported (the runner fails the run with it)
        victim = min(engines)
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.3)
        (line,) = executor.lost()
        assert f"(pid {victim}) died" in line, line
    finally:
        executor.apply(ch.plan_clear(topology))
        executor.close()
        local.down(journal)
    assert engine_pids() == set()
