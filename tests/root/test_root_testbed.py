"""Root tier: the local testbed, emulation apply/show/reset on real namespaces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from netbench import proc
from netbench.emulation import backends, changes as ch
from netbench.emulation.engines import Engines
from netbench.emulation.iptables import Iptables
from netbench.emulation.netlink.qdisc import NetlinkQdiscs
from netbench.emulation.executor import read_emulation, real_executor
from netbench.model.profile import Profile
from netbench.state.reset import reset
from netbench.testbed import netns as local
from tests.conftest import NETBENCH, netbench_processes

pytestmark = pytest.mark.root


def _rtt_ms(netns: str, address: str, count: int = 10, interval: float = 0.05) -> float:
    out = proc.run(["ping", "-c", str(count), "-i", str(interval), "-q", address], netns=netns, timeout=60).stdout
    match = re.search(r"= [\d.]+/([\d.]+)/", out)
    assert match, out
    return float(match.group(1))


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([*NETBENCH, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_testbed_up_show_exec_down(clean_machine):
    out = _cli("testbed", "up", "--nodes", "3").stdout
    assert "3 nodes" in out
    shown = json.loads(_cli("testbed", "show", "--json").stdout)
    names = [node["name"] for node in shown["nodes"]]
    assert names == ["n1", "n2", "n3"]
    assert all(node["netns"].startswith("netbench-") and node["address"] for node in shown["nodes"])
    for node in shown["nodes"]:  # what a sweep records, against sysctl run in the node
        sysctl = subprocess.run(["ip", "netns", "exec", node["netns"], "sysctl", "-n",
                                 "net.ipv4.tcp_congestion_control"], capture_output=True, text=True, check=True)
        assert local.congestion_control(node["netns"]) == sysctl.stdout.strip() != ""
    # node names in the command are replaced by addresses, and the exit code is passed on
    assert _cli("exec", "n1", "--", "ping", "-c", "1", "-W", "2", "n3").returncode == 0
    assert _cli("exec", "n1", "--", "false", check=False).returncode == 1
    _cli("testbed", "down")
    assert local.list_netbench_netns() == []


def test_testbed_subnet_avoids_host_routes(clean_machine):
    topo = local.up(2, clean_machine)
    import ipaddress

    subnet = ipaddress.ip_network(topo.subnet)
    for net in local.host_networks():
        assert not subnet.overlaps(ipaddress.ip_network(net, strict=False)), net


def test_userspace_apply_show_and_reset(clean_machine):
    topo = local.up(2, clean_machine)
    n1, n2 = topo.nodes
    base = _rtt_ms(n1.netns, n2.address)
    profile = Profile(name="t", delay_us=20_000, rate_bps=50_000_000)
    executor = real_executor(clean_machine, detach_engines=True)
    executor.apply(backends.plan_apply(profile, topo, "userspace"))
    rtt = _rtt_ms(n1.netns, n2.address)
    # 20 ms one-way at each egress: RTT near 40 ms over the unshaped base
    assert 39.0 <= rtt - base <= 44.0, (rtt, base)
    rows = read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(clean_machine.dir))
    for row in rows:
        assert row["backend"] == "userspace"
        assert row["qdisc"]["kind"] == "tbf" and row["qdisc"]["rate_bps"] == 50_000_000
        assert row["engine"]["alive"] and row["engine"]["params"]["delay_us"] == 20_000
        assert len(row["nfqueue_rules"]) == 1
    engine_pids = [pid for pid, cmd in netbench_processes() if "engine" in cmd]
    assert len(engine_pids) == 2
    removed = reset(clean_machine)
    assert any("namespace netbench-n1" in line for line in removed)
    assert local.list_netbench_netns() == []
    assert not [pid for pid in engine_pids if proc.start_time(pid) is not None]


def test_apply_twice_is_idempotent_and_change_replaces(clean_machine):
    topo = local.up(2, clean_machine)
    executor = real_executor(clean_machine, detach_engines=True)
    executor.apply(backends.plan_apply(Profile(delay_us=5_000, loss=0.0), topo, "userspace"))
    executor.apply(backends.plan_apply(Profile(delay_us=15_000, rate_bps=100_000_000), topo, "userspace"))
    rows = read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(clean_machine.dir))
    assert [len(r["nfqueue_rules"]) for r in rows] == [1, 1]
    assert [r["engine"]["params"]["delay_us"] for r in rows] == [15_000, 15_000]
    assert len([1 for _, cmd in netbench_processes() if "engine" in cmd]) == 2
    # a null profile clears everything but leaves the testbed
    executor.apply(backends.plan_apply(Profile(), topo, "userspace"))
    rows = read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(clean_machine.dir))
    assert all(r["qdisc"] is None and r["nfqueue_rules"] == [] for r in rows)
    assert not [1 for _, cmd in netbench_processes() if "engine" in cmd]


def test_cli_apply_show_reset(clean_machine):
    _cli("testbed", "up")
    dry = _cli("apply", "--latency", "5ms", "--dry-run").stdout
    assert "NFQUEUE" in dry or "netem" in dry
    assert Iptables().rules("netbench-n1") == []  # the dry run changed nothing
    _cli("apply", "--latency", "5ms", "--loss", "1%", "--bandwidth", "200mbit")
    shown = json.loads(_cli("show", "--json").stdout)
    assert [n["qdisc"]["rate_bps"] for n in shown["nodes"]] == [200_000_000] * 2
    bad = _cli("apply", "--loss", "101%", check=False)
    assert bad.returncode == 2 and "--loss" in bad.stderr and "Traceback" not in bad.stderr
    # the bad apply left the good one in place
    assert json.loads(_cli("show", "--json").stdout)["nodes"][0]["engine"]["params"]["loss"] == pytest.approx(0.01)
    out = _cli("reset").stdout
    assert "removed" in out
    assert "nothing to remove" in _cli("reset").stdout
    assert local.list_netbench_netns() == []


def test_reset_after_controller_sigkill(clean_machine):
    """A controller killed with SIGKILL mid-apply: reset finds and removes everything."""
    script = (
        "import os, signal\n"
        "from netbench.state.journal import Journal\n"
        "from netbench.testbed import netns as local\n"
        "from netbench.emulation import backends, changes as ch\n"
        "from netbench.emulation.executor import real_executor\n"
        "from netbench.model.profile import Profile\n"
        "j = Journal(); topo = local.up(2, j)\n"
        "real_executor(j).apply(backends.plan_apply(Profile(delay_us=3000, rate_bps=10**8), topo, 'userspace'))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert result.returncode == -9
    assert local.list_netbench_netns()  # it left its testbed behind
    removed = reset(clean_machine)
    assert any(line.startswith("namespace netbench-") for line in removed)
    assert local.list_netbench_netns() == []
    assert netbench_processes() == []
    assert reset(clean_machine) == []  # idempotent


# Runs inside its own mount namespace (a private /run/netns, so no one else's reset or
# testbed sees these namespaces, nor this test theirs) and its own network namespace, which
# plays the host's: were reset to stop the processes of a reference to it, it would stop
# this script, never anything outside it.
_FOREIGN_NAMESPACES = r"""
import json, os, subprocess, sys
from pathlib import Path
from pyroute2 import netns
from netbench import proc
from netbench.model import topology as topo

subprocess.run(["mount", "-t", "tmpfs", "nbtest", "/run/netns"], check=True)
children = {}
def sleeper(name, *prefix):
    children[name] = subprocess.Popen([*prefix, "sleep", "300"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
    Path(sys.argv[1]).write_text(json.dumps({k: p.pid for k, p in children.items()}))

netns.create("netbench-something")                  # a user's, named netbench-*
sleeper("user", "nsenter", "--net=/run/netns/netbench-something")
for name in ("netbench-host", "netbench-n1"):         # references to the host's namespace
    Path("/run/netns", name).touch()
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", f"/run/netns/{name}"], check=True)
sleeper("host")
netns.create("netbench-n2")                           # a testbed namespace no journal here recorded
sleeper("left", "nsenter", "--net=/run/netns/netbench-n2")
gone = subprocess.Popen(["sleep", "300"])
dead = topo.scratch_netns("doctor", gone.pid, proc.start_time(gone.pid))
gone.kill(); gone.wait()
live = topo.scratch_netns("probe", os.getpid(), proc.start_time(os.getpid()))
netns.create(dead); netns.create(live)

cli = [sys.executable, "-m", "netbench.cli"]
shown = subprocess.run([*cli, "testbed", "show", "--json"], capture_output=True, text=True, timeout=120)
first = subprocess.run([*cli, "reset"], capture_output=True, text=True, timeout=120)
first = {"rc": first.returncode, "stdout": first.stdout, "stderr": first.stderr,
         "namespaces": sorted(netns.listnetns()), "alive": {k: p.poll() is None for k, p in children.items()}}
result = subprocess.run([*cli, "reset", "--all-namespaces"], capture_output=True, text=True, timeout=120)
print(json.dumps({
    "shown": json.loads(shown.stdout or "{}"), "rc": result.returncode, "stdout": result.stdout,
    "stderr": result.stderr, "namespaces": sorted(netns.listnetns()), "dead": dead, "live": live,
    "alive": {k: p.poll() is None for k, p in children.items()}, "first": first}))
for p in children.values():
    p.kill(); p.wait()
"""


def test_reset_leaves_what_netbench_did_not_make(state_dir, tmp_path):
    """`netbench reset` removes only what its journal recorded (and scratch namespaces whose
    maker is gone); `--all-namespaces` also the testbed names netbench gives, never another
    name, and never a process in the host's own namespace."""
    import os

    from tests.conftest import ROOT

    if os.geteuid() != 0:
        pytest.skip("needs root (mount and network namespaces)")
    os.makedirs("/run/netns", exist_ok=True)  # the mount point; what is mounted on it stays private
    pids_file = tmp_path / "pids.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        result = subprocess.run(["unshare", "--mount", "--propagation", "private", "--net", "--",
                                 sys.executable, "-c", _FOREIGN_NAMESPACES, str(pids_file)],
                                capture_output=True, text=True, timeout=300, env=env)
    finally:
        pids = json.loads(pids_file.read_text()) if pids_file.exists() else {}
        for pid in pids.values():  # if the script itself was stopped, its sleepers are still there
            try:
                if b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, 9)
            except OSError:
                pass
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout)
    assert [node["name"] for node in seen["shown"]["nodes"]] == ["n2"]
    first = seen["first"]  # a plain reset: netbench-n2 (no journal here recorded it) stays, its process alive
    assert first["rc"] == 0, first["stderr"]
    assert first["alive"] == {"user": True, "host": True, "left": True}
    assert first["namespaces"] == sorted(["netbench-something", "netbench-host", "netbench-n1", "netbench-n2",
                                          seen["live"]])
    assert f"namespace {seen['dead']}" in first["stdout"]
    assert "netbench-n2 left alone" in first["stderr"] and "--all-namespaces" in first["stderr"]
    assert seen["rc"] == 0, seen["stderr"]
    assert seen["alive"] == {"user": True, "host": True, "left": False}
    assert seen["namespaces"] == sorted(["netbench-something", "netbench-host", "netbench-n1", seen["live"]])
    assert "namespace netbench-n2 and 1 process(es) in it" in seen["stdout"]
    assert "netbench-n1 left alone" in seen["stderr"]


@pytest.fixture
def host_like_netns():
    """A namespace standing in for a remote host's own: interface eth1 (a veth to eth2). Not
    named netbench-*, so no reset (this test's or anyone else's) takes it."""
    import os

    from pyroute2 import NetNS
    from pyroute2 import netns as pnetns

    if os.geteuid() != 0:
        pytest.skip("needs root (creates a network namespace)")
    name = f"nbtest-host-{os.getpid()}"
    pnetns.create(name)
    try:
        with NetNS(name, flags=0) as ns:
            ns.link("add", ifname="eth1", kind="veth", peer="eth2")
            ns.link("set", index=ns.link_lookup(ifname="eth1")[0], state="up")
        yield name
    finally:
        pnetns.remove(name)


def _tc(netns: str, *args, **kwargs) -> None:
    from pyroute2 import NetNS

    with NetNS(netns, flags=0) as ns:
        ns.tc(args[0], args[1], ns.link_lookup(ifname="eth1")[0], *args[2:], **kwargs)


def test_a_hosts_own_root_and_ingress_qdiscs_are_never_replaced(host_like_netns, state_dir):
    from netbench.errors import EmulationError
    from netbench.state.journal import Journal
    from netbench.remote.agent import host_topology

    netns, journal, qdiscs = host_like_netns, Journal(state_dir), NetlinkQdiscs()
    topo = host_topology("h1", "eth1", netns)
    assert qdiscs.root_qdisc(netns, "eth1")[1] == 0  # the kernel's default: netbench may replace it
    assert qdiscs.ingress_qdisc(netns, "eth1") is None
    _tc(netns, "add", "htb", handle="1:", default=1)
    with pytest.raises(EmulationError, match="h1: eth1 has a root qdisc htb 1: that netbench did not set"):
        real_executor(journal).apply(backends.plan_apply(Profile(rate_bps=100_000_000), topo, "userspace"))
    assert qdiscs.root_qdisc(netns, "eth1") == ("htb", 0x10000)
    assert journal.pending() == []
    _tc(netns, "add", "ingress", handle=0xFFFF0000)
    with pytest.raises(EmulationError, match="h1: eth1 has a qdisc ingress at its ingress that netbench did not set"):
        real_executor(journal).apply(backends.plan_apply(Profile(delay_us=1_000, direction="ingress"), topo, "netem"))
    assert qdiscs.ingress_qdisc(netns, "eth1") == "ingress"
    assert qdiscs.root_qdisc(netns, "eth1") == ("htb", 0x10000)
    assert journal.pending() == []
    # once the host's own root is gone, netbench shapes, and replaces its own root next time
    _tc(netns, "del", "htb", handle="1:", root=True)
    executor = real_executor(journal)
    executor.apply(backends.plan_apply(Profile(rate_bps=100_000_000), topo, "userspace"))
    executor.apply(backends.plan_apply(Profile(rate_bps=50_000_000), topo, "userspace"))
    assert qdiscs.read(netns, "eth1")["rate_bps"] == 50_000_000
    executor.apply(ch.plan_clear(topo))
    assert qdiscs.root_qdisc(netns, "eth1")[1] == 0


def test_a_missing_namespace_is_an_error_and_is_never_created():
    """pyroute2's NetNS creates a missing namespace by default, unjournaled."""
    import os

    from pyroute2 import netns as pnetns

    from netbench.errors import EmulationError

    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces)")
    name = f"nbtest-gone-{os.getpid()}"
    try:
        with pytest.raises(EmulationError, match=f"namespace {name} does not exist"):
            NetlinkQdiscs().replace_tbf(name, "eth0", 100_000_000, 16_000, 32_000)
        with pytest.raises(EmulationError, match=f"namespace {name} does not exist"):
            NetlinkQdiscs().read(name, "eth0")
        assert NetlinkQdiscs().clear(name, "eth0") is False
        assert name not in pnetns.listnetns()
    finally:
        if name in pnetns.listnetns():
            pnetns.remove(name)


def test_commands_run_inside_the_namespace_asked_for(host_like_netns):
    import os

    inode = os.stat(f"/run/netns/{host_like_netns}").st_ino
    assert proc.run(["readlink", "/proc/self/ns/net"], netns=host_like_netns).stdout.strip() == f"net:[{inode}]"
    child = proc.spawn(["sh", "-c", "echo $$; readlink /proc/self/ns/net"], netns=host_like_netns,
                       stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=30)
    assert out.decode().split() == [str(child.pid), f"net:[{inode}]"]
    assert "eth1" in proc.run(["ip", "-o", "link"], netns=host_like_netns).stdout
