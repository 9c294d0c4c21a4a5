"""Root tier: per-destination shaping by the userspace backend's delay engines (real kernel).

A 4-node testbed with one profile (10 ms, 100 Mbit/s) gets, in place, a two-group PairTopology (n1, n2 near: 2 ms one way; n3, n4 far from them:
25 ms one way). n1 pings its near peer n2 and its far peer n3 at the same time, while UDP from n1
to n3 loads n1's engine with far traffic: every RTT is above twice its one-way delay, and the near
pair's RTT stays below the far pair's one-way delay (before, one queue per node released in
arrival order: every near packet waited behind the far ones, 25 ms and more).
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tests.conftest import cli_ok, engine_pids

pytestmark = pytest.mark.root

NEAR_US, FAR_US = 2_000, 25_000


def _two_groups():
    from netbench.model.pairs import PairLink, PairTopology
    from netbench.model.profile import profile_from_mapping

    groups = {"n1": "a", "n2": "a", "n3": "b", "n4": "b"}
    near = profile_from_mapping({"delay": f"{NEAR_US}us"}, "test")
    far = profile_from_mapping({"delay": f"{FAR_US}us"}, "test")
    links = tuple(PairLink(src, dst, near if groups[src] == groups[dst] else far)
                  for src in groups for dst in groups if src != dst)
    return PairTopology("two-groups", tuple(groups), links)


def _apply_pairs(journal) -> None:
    from netbench.emulation import backends
    from netbench.emulation.executor import real_executor
    from netbench.state.journal import Lock
    from netbench.testbed import netns as local

    topology = local.discover()
    executor = real_executor(journal, detach_engines=True)
    try:
        with Lock(journal.dir):
            executor.apply(backends.plan_pairs_apply(_two_groups(), topology, "userspace", held=executor.held()))
    finally:
        executor.close()


def _ping(src: str, dst: str, count: int) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", f"netbench-{src}", "ping", "-n", "-i", "0.05", "-c", str(count),
                             dst], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rtts(ping: subprocess.Popen) -> list[float]:
    out, _ = ping.communicate(timeout=60)
    rtts = [float(m) for m in re.findall(r"time=([\d.]+) ms", out)]
    assert len(rtts) >= 10, out[-1000:]
    return rtts


def test_a_near_pair_is_not_held_back_by_a_loaded_far_pair(clean_machine, state_dir):
    cli_ok("testbed", "up", "--nodes", "4")
    cli_ok("apply", "--latency", "10ms", "--bandwidth", "100mbit", "--backend", "userspace")
    engines = engine_pids()
    _apply_pairs(clean_machine)  # in place: the running engines take their tables, the tbf goes
    assert engine_pids() == engines and len(engines) == 4
    shown = {row["node"]: row for row in json.loads(cli_ok("show", "--json").stdout)["nodes"]}
    # `show` reads each engine's table back (its stats, or its ready line before the first stats)
    assert [(p["dst"], p["delay_us"]) for p in shown["n1"]["engine"]["pairs"]] == [
        ("10.213.0.2", NEAR_US), ("10.213.0.3", FAR_US), ("10.213.0.4", FAR_US)]
    assert shown["n1"]["qdisc"] is None  # no aggregate tbf: each pair's rate is the engine's
    server = subprocess.Popen(["ip", "netns", "exec", "netbench-n3", "iperf3", "-s", "-1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    load = None
    try:
        time.sleep(0.5)
        load = subprocess.Popen(["ip", "netns", "exec", "netbench-n1", "iperf3", "-c", "10.213.0.3", "-u", "-b",
                                 "20M", "-l", "1200", "-t", "6"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        time.sleep(1.0)  # the far queue is full of UDP before the pings start
        near, far = _ping("n1", "10.213.0.2", 60), _ping("n1", "10.213.0.3", 60)
        near_rtts, far_rtts = _rtts(near), _rtts(far)
        load_out, _ = load.communicate(timeout=60)
    finally:
        for child in (load, server):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
    assert min(near_rtts) >= 2 * NEAR_US / 1000, sorted(near_rtts)[:5]
    assert min(far_rtts) >= 2 * FAR_US / 1000, sorted(far_rtts)[:5]
    # the near pair is not dragged up by the far pair's traffic through the same engine
    assert max(near_rtts) < FAR_US / 1000, sorted(near_rtts)[-5:]
    assert "receiver" in load_out or "Jitter" in load_out, load_out[-500:]
    stats = json.loads((state_dir / "engines" / "netbench-sw-q1.json").read_text())
    by_dst = {row["dst"]: row for row in stats["pairs"]}
    assert by_dst["10.213.0.3"]["packets"] > 1000  # the load went through n1's far queue
    assert by_dst["10.213.0.2"]["packets"] >= len(near_rtts)
