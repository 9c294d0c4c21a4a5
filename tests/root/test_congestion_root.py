"""--congestion-control on real namespaces (root): a tiny sweep on a testbed that `testbed up`
brought up, whose job's own TCP connections (ss -ti, in each node, during the run) use the
algorithm asked for, and whose nodes and host have their previous settings back afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from netbench.model import congestion as cc
from netbench.testbed import netns as local
from tests.conftest import NETBENCH, ROOT, cli_ok

pytestmark = pytest.mark.root

REGEX = r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms"


def test_a_sweep_sets_every_nodes_congestion_control_and_puts_it_back(clean_machine, tmp_path):
    host_default = local.read_sysctl(cc.DEFAULT_KEY)
    allowed = local.read_sysctl(cc.ALLOWED_KEY)
    # one the nodes do not have already (cubic, unless the host defaults to it): a real change
    chosen = "cubic" if host_default != "cubic" else "reno"
    cli_ok("testbed", "up", "--nodes", "2")  # outlives the sweep: its nodes must get their own back
    before = {n: local.read_sysctl(cc.DEFAULT_KEY, n) for n in ("netbench-n1", "netbench-n2")}
    assert set(before.values()) == {host_default}, before
    job = tmp_path / "job.sh"  # each rank: the example's steps, and what its node's sockets use meanwhile
    job.write_text(f"{sys.executable} {ROOT}/examples/plain_steps.py --kib 64 &\n"
                   "sleep 1\n"
                   'echo "sysctl $(cat /proc/sys/net/ipv4/tcp_congestion_control)" >&2\n'
                   "ss -tinH state established | sed 's/^/ss /' >&2\n"
                   "wait\n")
    out = tmp_path / "out"
    result = subprocess.run([*NETBENCH, "sweep", "--latency", "20ms", "--workers", "2", "--warmup", "2",
                             "--steps", "40", "--images-per-step", "64", "--step-regex", REGEX,
                             "--congestion-control", chosen, "--output", str(out), "--", "sh", str(job)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"TCP congestion control on every node: {chosen} (asked for this sweep: {chosen}" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["congestion_control"] == chosen
    assert manifest["tcp_congestion_control"] == {"n1": chosen, "n2": chosen}  # read back in the nodes
    logs = sorted(out.glob("logs/*/n*-worker*.log"))
    lines = [line for log in logs for line in log.read_text().splitlines()]
    assert sorted(line for line in lines if line.startswith("sysctl ")) == [f"sysctl {chosen}"] * 2, lines
    # ss -ti: each connection's second line starts with its algorithm (cubic wscale:..., bbr wscale:...)
    algorithms = [line.split()[1] for line in lines if line.startswith("ss ") and "rtt:" in line]
    assert algorithms and set(algorithms) == {chosen}, lines
    # afterwards: the testbed is still up, with the nodes' and the host's own settings back
    assert {n: local.read_sysctl(cc.DEFAULT_KEY, n) for n in before} == before
    assert local.read_sysctl(cc.ALLOWED_KEY) == allowed
    assert [e for e in clean_machine.pending() if e.kind == "sysctl"] == []
    assert Path("/run/netns/netbench-n1").exists()


def test_two_sweeps_widening_the_hosts_allowed_list_at_once_keep_it_until_the_last_is_done(tmp_path, monkeypatch):
    """The host's real tcp_allowed_congestion_control, two journals (two state folders): both
    widen it by one name; the first to finish leaves it for the other, the second takes it out.
    The list as it was is written back whatever happens."""
    import os

    from netbench.state.journal import Journal
    from netbench.testbed import congestion

    if os.geteuid() != 0:
        pytest.skip("needs root (the host's sysctl)")
    monkeypatch.setenv("NETBENCH_HOLDS_DIR", str(tmp_path / "holds"))
    allowed, default = local.read_sysctl(cc.ALLOWED_KEY), local.read_sysctl(cc.DEFAULT_KEY)
    name = next((n for n in local.read_sysctl(cc.AVAILABLE_KEY).split() if n not in (default, "reno")), None)
    if name is None:
        pytest.skip("this kernel has no congestion control beside its default and reno")
    try:
        local.write_sysctl(cc.ALLOWED_KEY, cc.narrowed(allowed.split(), name) or "reno")
        first, second = Journal(tmp_path / "a"), Journal(tmp_path / "b")
        a, b = congestion.hold_allowed(first, name), congestion.hold_allowed(second, name)
        assert a is not None and b is not None and name in local.read_sysctl(cc.ALLOWED_KEY).split()
        congestion.restore(first, [a])
        assert name in local.read_sysctl(cc.ALLOWED_KEY).split()  # the other sweep still has it
        congestion.restore(second, [b])
        assert name not in local.read_sysctl(cc.ALLOWED_KEY).split()
        assert first.pending() == [] and second.pending() == []
    finally:
        local.write_sysctl(cc.ALLOWED_KEY, allowed)
    assert local.read_sysctl(cc.ALLOWED_KEY) == allowed
