"""`netbench apply --topology --inventory` against three real sshd hosts (tests/ssh/lab.py).

Each host shapes its data interface's egress toward the other two hosts' tf_address as its
row of the topology says. Only netem shapes per destination on a host: where the lab's
kernel has netem, the topology is applied and every host's per-destination classes are read
back with `tc -j` (independently of netbench) and with `show --inventory`; where it has none
(this machine), the plan is checked and the refusal names a host, leaving every host unshaped.
The netem half passes under `make test-kernel`'s VM (vng, Debian's stock kernel) when run there
by hand; that VM's root account is locked, which sshd refuses without PAM, so unlock it inside
the VM first (`sed 's/^root:!/root:*/' /etc/shadow > /tmp/shadow; mount --bind /tmp/shadow /etc/shadow`).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tests.kernel.test_pairs_kernel import tc_pairs
from tests.ssh.lab import root_lab

from netbench.emulation.probe import probe_netem

pytestmark = pytest.mark.root

TOPOLOGY = """name: three
groups:
  near: [h1, h2]
  far: [h3]
links:
  near: {delay: 2ms}
  near-far: {delay: 25ms, rate: 100mbit}
"""
DELAY_US = {("h1", "h2"): 2_000, ("h2", "h1"): 2_000, ("h1", "h3"): 25_000, ("h3", "h1"): 25_000,
            ("h2", "h3"): 25_000, ("h3", "h2"): 25_000}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from root_lab(tmp_path_factory, "nbpair", count=3)


@pytest.fixture
def files(lab):
    """The inventory and the topology; every host reset to nothing after the test."""
    inventory = lab.write_inventory()
    topology = lab.dir / "three.yaml"
    topology.write_text(TOPOLOGY)
    yield str(inventory), str(topology)
    result = lab.netbench("reset", "--inventory", str(inventory))
    assert result.returncode == 0, result.stderr
    for host in lab.hosts:
        assert (host.root_qdisc("data0") or {}).get("handle") != "4e42:", f"{host.name} still shaped"


def _address(lab, name):
    return next(h.data_address for h in lab.hosts if h.name == name)


def test_the_dry_run_plans_each_hosts_row_toward_the_others_tf_address(lab, files):
    inventory, topology = files
    result = lab.netbench("apply", "--topology", topology, "--inventory", inventory, "--backend", "netem",
                          "--dry-run", check=True)
    out = result.stdout
    for host in lab.hosts:
        assert f"host {host.name} (data0): backend netem" in out
        lines = [line for line in out.splitlines() if line.strip().startswith(f"{host.name}: tc filter replace")
                 and "match ip dst" in line]
        assert sorted(line.split("match ip dst ")[1].split()[0] for line in lines) == sorted(
            f"{h.data_address}/32" for h in lab.hosts if h is not host), out
    assert "no host was changed" in result.stderr + out
    assert not any((h.root_qdisc("data0") or {}).get("handle") == "4e42:" for h in lab.hosts)


def test_a_topology_on_hosts_without_netem_is_refused_naming_a_host_and_changes_nothing(lab, files):
    if probe_netem("nbpair-probe")[0]:
        pytest.skip("the lab's kernel has netem: the apply test covers it")
    inventory, topology = files
    result = lab.netbench("apply", "--topology", topology, "--inventory", inventory, "--lease", "0")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "error: host h1: a topology needs the netem backend there" in result.stderr
    assert not any((h.root_qdisc("data0") or {}).get("handle") == "4e42:" for h in lab.hosts)


def test_a_topology_applies_per_destination_and_reads_back(lab, files):
    if not probe_netem("nbpair-probe")[0]:
        pytest.skip("no netem on this kernel: each host's row is planned and refused (tests above)")
    inventory, topology = files
    lab.netbench("apply", "--topology", topology, "--inventory", inventory, "--lease", "0", check=True)
    for host in lab.hosts:  # read with tc, as the kernel tier reads a local node's tree
        shaped, _, _ = tc_pairs(SimpleNamespace(netns=host.netns, ifname="data0"))
        want = {_address(lab, dst): delay / 1e6 for (src, dst), delay in DELAY_US.items() if src == host.name}
        assert {address: delay for address, (_, delay, _) in shaped.items()} == pytest.approx(want), shaped
        far = _address(lab, "h3") if host.name != "h3" else _address(lab, "h1")
        assert shaped[far][2] == 100_000_000
    shown = json.loads(lab.netbench("show", "--inventory", inventory, "--json", check=True).stdout)
    got = {(link["src"], link["dst"]): link["profile"]["delay_us"] for link in shown["pairs"]["links"]}
    assert got == DELAY_US
