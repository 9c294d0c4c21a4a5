"""Remote mode against real sshd servers (Debian's openssh-server) in test namespaces,
driven through fabric by the netbench CLI running in a controller namespace (tests/ssh/lab.py).

The hosts' shaping is real kernel state in their namespaces (tbf: this kernel has no netem),
read back here with `tc`, independently of netbench.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from tests.ssh.lab import root_lab

pytestmark = pytest.mark.root

TBF_100MBIT_BYTES_S = 12_500_000


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from root_lab(tmp_path_factory, "nbssh")


@pytest.fixture
def inventory(lab):
    """The lab's inventory, and every host reset to nothing after the test."""
    path = lab.write_inventory()
    yield str(path)
    result = lab.netbench("reset", "--inventory", str(path))
    assert result.returncode == 0, result.stderr
    for host in lab.hosts:
        assert _shaped(host) is None, f"{host.name} still shaped after reset"


def _shaped(host):
    qdisc = host.root_qdisc("data0")
    return qdisc if qdisc and qdisc.get("handle") == "4e42:" else None


def _wait(predicate, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def _wait_for_line(child, text: str, timeout: float = 60) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line and child.poll() is not None:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"never printed {text!r}; got {seen!r}; stderr {child.stderr.read() if child.poll() is not None else ''}")


def test_doctor_checks_every_host_over_ssh(lab, inventory):
    result = lab.netbench("doctor", "--inventory", inventory, "--no-tensorflow", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ready"] is True and sorted(report["hosts"]) == ["h1", "h2"]
    for rows in report["hosts"].values():
        status = {row["check"]: row["status"] for row in rows}
        assert status["reachable"] == status["root"] == status["netbench"] == status["interface"] == "ok"
        assert status["control path"] == "ok"
        assert status["backend"] in ("ok", "limited")


def test_unknown_host_keys_are_refused_unless_insecure_is_asked_for(lab, inventory):
    (lab.dir / "empty_known_hosts").write_text("")
    path = lab.write_inventory(known_hosts=str(lab.dir / "empty_known_hosts"))
    try:
        result = lab.netbench("doctor", "--inventory", str(path), "--no-tensorflow", "--json")
        assert result.returncode == 1
        rows = json.loads(result.stdout)["hosts"]["h2"]
        assert rows[0]["status"] == "missing" and "host key not in known_hosts" in rows[0]["detail"]
        result = lab.netbench("show", "--inventory", str(path))
        assert result.returncode == 1 and "host key not in known_hosts" in result.stderr
        result = lab.netbench("show", "--inventory", str(path), "--insecure-host-keys", "--json")
        assert result.returncode == 0, result.stderr
    finally:
        lab.write_inventory()


def test_apply_show_reset_on_real_hosts(lab, inventory):
    result = lab.netbench("apply", "--inventory", inventory, "--bandwidth", "100mbit", "--lease", "0")
    assert result.returncode == 0, result.stderr
    for host in lab.hosts:
        qdisc = _shaped(host)
        assert qdisc, (result.stdout, host.root_qdisc("data0"), (host.state_dir / "journal.jsonl").read_text())
        assert qdisc["kind"] == "tbf" and qdisc["options"]["rate"] == TBF_100MBIT_BYTES_S
        assert host.root_qdisc("ctl0").get("handle") != "4e42:"  # the control path is untouched
    shown = json.loads(lab.netbench("show", "--inventory", inventory, "--json", check=True).stdout)["hosts"]
    for name in ("h1", "h2"):
        (row,) = shown[name]["nodes"]
        assert row["ifname"] == "data0" and row["backend"] == "userspace"
        assert row["profile"]["rate"] == "100mbit"
        assert shown[name]["lease"]["held"] is False
    result = lab.netbench("reset", "--inventory", inventory, check=True)
    assert re.search(r"^h1: removed qdisc 4e42: on nbhost-\d+/data0$", result.stdout, re.M), result.stdout
    assert not any(_shaped(h) for h in lab.hosts)
    assert "h1: nothing to remove" in lab.netbench("reset", "--inventory", inventory, check=True).stdout


def test_a_plan_on_the_ssh_interface_is_refused_and_changes_nothing(lab, inventory):
    path = lab.write_inventory()
    try:
        path.write_text(path.read_text().replace("interface: data0", "interface: ctl0"))
        result = lab.netbench("apply", "--inventory", str(path), "--bandwidth", "100mbit", "--lease", "0")
        assert result.returncode == 2
        assert "plan shapes ctl0, which carries this SSH control connection" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 2  # the error and its hint
        for host in lab.hosts:
            assert host.root_qdisc("ctl0").get("handle") != "4e42:"
    finally:
        lab.write_inventory()


def test_a_userspace_host_refuses_delay_with_the_reason(lab, inventory):
    result = lab.netbench("apply", "--inventory", inventory, "--latency", "10ms", "--lease", "0")
    assert result.returncode == 1
    assert "without netem a remote host shapes rate only" in result.stderr
    assert not any(_shaped(h) for h in lab.hosts)


def test_killed_controller_then_reset_restores_every_host(lab, inventory):
    child = lab.spawn_netbench("apply", "--inventory", inventory, "--bandwidth", "50mbit", "--lease", "60")
    try:
        _wait_for_line(child, "holding a 60 s lease")
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert all(_shaped(h) for h in lab.hosts)  # a long lease: the hosts keep their shaping
    shown = json.loads(lab.netbench("show", "--inventory", inventory, "--json", check=True).stdout)["hosts"]
    assert all(shown[n]["lease"]["held"] and shown[n]["watchers"] for n in ("h1", "h2"))
    watchers = [pid for n in ("h1", "h2") for pid in shown[n]["watchers"]]
    result = lab.netbench("reset", "--inventory", inventory, check=True)
    assert "removed lease" in result.stdout
    assert not any(_shaped(h) for h in lab.hosts)
    assert _wait(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in watchers), 5)


def test_renewed_lease_holds_then_expired_lease_reverts_by_itself(lab, inventory):
    lease_s = 1.5
    child = lab.spawn_netbench("apply", "--inventory", inventory, "--bandwidth", "20mbit", "--lease", f"{lease_s}")
    try:
        _wait_for_line(child, "holding a 1.5 s lease")
        time.sleep(3 * lease_s)  # the controller renews: still shaped well past one lease
        assert all(_shaped(h) for h in lab.hosts)
        killed_at = time.monotonic()
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert _wait(lambda: not any(_shaped(h) for h in lab.hosts), timeout=lease_s + 5)
    reverted_after = time.monotonic() - killed_at
    assert reverted_after <= lease_s + 5
    for host in lab.hosts:  # the host's own journal empties once its reset is through (just after the qdisc)
        assert _wait(lambda: not (host.state_dir / "journal.jsonl").exists(), timeout=5), host.name
        log = (host.state_dir / "lease-watch.log").read_text()
        assert '"event": "lease expired"' in log


def test_a_second_controller_is_refused_a_held_host_until_it_takes_over(lab, inventory):
    first = lab.spawn_netbench("apply", "--inventory", inventory, "--bandwidth", "50mbit", "--lease", "30")
    second = None
    try:
        _wait_for_line(first, "holding a 30 s lease")
        refused = lab.netbench("apply", "--inventory", inventory, "--bandwidth", "20mbit", "--lease", "0")
        assert refused.returncode == 1, refused.stderr
        assert re.search(r"host h\d: lease held by \S+@\S+:\d+:[0-9a-f]{8} since [-0-9]+ [:0-9]+, expires in",
                         refused.stderr), refused.stderr
        assert "--takeover" in refused.stderr
        assert all(_shaped(h)["options"]["rate"] == 50_000_000 // 8 for h in lab.hosts)  # nothing changed
        second = lab.spawn_netbench("apply", "--inventory", inventory, "--bandwidth", "20mbit", "--lease", "60",
                                    "--takeover")
        _wait_for_line(second, "holding a 60 s lease")
        _, err = first.communicate(timeout=60)  # it learns at its next renewal (every 10 s)
        assert first.returncode == 1 and "another controller took it over (held by" in err, err
        # the first controller left the second one's shaping alone
        assert all(_shaped(h)["options"]["rate"] == 20_000_000 // 8 for h in lab.hosts)
    finally:
        for child in (first, second):
            if child is not None and child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=10)


def test_provision_installs_this_netbench_into_each_hosts_venv(lab, inventory):
    """The hosts are offline: their venvs see the controller venv's packages (TensorFlow and
    the rest) through a .pth file, and pip installs only netbench's wheel (--no-deps
    --no-index). What is checked: the wheel built from this source tree lands in each host's
    own venv, and that venv's netbench runs and reports the controller's version."""
    import subprocess

    import yaml

    from netbench import __version__
    from tests.ssh.lab import VENV

    site = next((VENV / "lib").glob("python3*/site-packages"))
    data = yaml.safe_load(open(inventory).read())
    venvs = {}
    import glob

    staged_before = set(glob.glob("/tmp/netbench-provision*"))
    for host in lab.hosts:
        venv = lab.dir / f"venv {host.name}"  # a space: quoted once, as one word, on the host
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=120)
        own_site = next((venv / "lib").glob("python3*/site-packages"))
        (own_site / "controller-packages.pth").write_text(f"{site}\n")
        data["hosts"][host.name]["venv"] = str(venv)
        venvs[host.name] = venv
    path = lab.dir / "provision.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = lab.netbench("provision", "--inventory", str(path), "--pip-args", "--no-deps --no-index", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for name, venv in venvs.items():
        assert f"{name}: installed netbench, version {__version__} in {venv}" in " ".join(result.stdout.split())
        assert list((venv / "lib").glob(f"python3*/site-packages/netbench-{__version__}.dist-info"))
        where = subprocess.run([str(venv / "bin" / "python"), "-c", "import netbench; print(netbench.__file__)"],
                               capture_output=True, text=True, cwd="/", check=True).stdout
        assert where.startswith(str(venv)), where  # the provisioned copy, not the source tree
    assert set(glob.glob("/tmp/netbench-provision*")) <= staged_before  # each staging folder is removed


def _edited_inventory(lab, name: str, **host_keys) -> str:
    """The lab's inventory with `host_keys` set on every host, written to `name`."""
    import yaml

    data = yaml.safe_load(lab.write_inventory().read_text())
    for entry in data["hosts"].values():
        entry.update(host_keys)
    path = lab.dir / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_a_sudo_host_still_knows_its_control_path(lab, inventory):
    """sudo's env_reset drops SSH_CONNECTION: the controller passes the session's endpoints,
    so a sudo host still refuses to shape its SSH interface, and doctor names that interface."""
    import shutil

    if shutil.which("sudo") is None:
        pytest.skip("needs sudo (make install installs it)")
    path = _edited_inventory(lab, "sudo-ctl.yaml", sudo=True, interface="ctl0")
    result = lab.netbench("apply", "--inventory", path, "--bandwidth", "100mbit", "--lease", "0")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "plan shapes ctl0, which carries this SSH control connection" in result.stderr
    for host in lab.hosts:
        assert host.root_qdisc("ctl0").get("handle") != "4e42:"
    path = _edited_inventory(lab, "sudo.yaml", sudo=True)
    result = lab.netbench("doctor", "--inventory", path, "--no-tensorflow", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    for rows in json.loads(result.stdout)["hosts"].values():
        (row,) = [r for r in rows if r["check"] == "control path"]
        assert row["status"] == "ok" and row["detail"].startswith("SSH arrives on ctl0;"), row


def test_a_proxyjump_hop_has_its_host_key_checked_too(lab, inventory):
    """h2 reached through h1 (ProxyJump): the hop's key is checked against the same known_hosts."""
    import yaml

    h1, h2 = lab.hosts
    config = (lab.dir / "ssh_config").read_text()
    (lab.dir / "ssh_config_jump").write_text(
        config + f"\nHost {h2.name}-via-{h1.name}\n  HostName {h2.control_address}\n  User root\n"
        f"  IdentityFile {lab.dir / 'id_ed25519'}\n  ProxyJump {h1.name}\n")
    known = (lab.dir / "known_hosts").read_text().splitlines()
    without_hop = [line for line in known if not line.startswith(h1.control_address + " ")]
    (lab.dir / "known_hosts_no_hop").write_text("\n".join(without_hop) + "\n")
    data = yaml.safe_load(lab.write_inventory().read_text())
    data["ssh_config"] = str(lab.dir / "ssh_config_jump")
    data["hosts"] = {h2.name: {"ssh": f"{h2.name}-via-{h1.name}", "tf_address": h2.data_address,
                               "state_dir": str(h2.state_dir)}}
    path = lab.dir / "jump.yaml"
    for known_hosts, ok in (("known_hosts_no_hop", False), ("known_hosts", True)):
        data["known_hosts"] = str(lab.dir / known_hosts)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        result = lab.netbench("show", "--inventory", str(path), "--json")
        if ok:
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout)["hosts"][h2.name]["interface"] == "data0"
        else:
            assert result.returncode == 1, result.stdout
            assert f"jump host {h1.control_address}: host key not in known_hosts" in result.stderr
