"""Remote mode without SSH: wire format, per-host plans, control-path guard, leases, and the
controller's orchestration against FakeHost (tests/fakes/remote.py)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import time

import pytest
from click.testing import CliRunner
from tests.fakes.remote import FakeHost, failed, ok_json

from netbench.state import lease
from netbench.remote import controller as remote
from netbench.remote import keeper as leases
from netbench.cli.app import main
from netbench.emulation import backends, changes as ch
from netbench.emulation import wire
from netbench.errors import BackendUnavailable, EmulationError, ResetIncomplete, UsageError
from netbench.remote.inventory import inventory_from_mapping
from netbench.model.profile import Profile
from netbench.state.journal import Journal
from netbench.remote.agent import (HOST_NETNS, LinkInfo, apply_plan, bind_plan, guard_control_path, ssh_endpoints,
                                  stacked_devices, touched_interfaces)
from netbench.remote.ssh import CommandResult
from netbench.model.topology import plan_topology

INV = inventory_from_mapping({
    "defaults": {"interface": "eth1", "venv": "/opt/nb"},
    "hosts": {"a": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1"},
              "b": {"ssh": "10.0.0.2", "tf_address": "10.9.0.2", "sudo": True, "user": "u",
                    "state_dir": "/var/lib/nb state"}}}, "inv.yaml")
RICH = Profile(name="rich", delay_us=20_000, jitter_us=5_000, distribution="pareto", loss_model="gilbert-elliott",
               ge_p=0.01, ge_r=0.3, ge_bad_loss=0.9, ge_good_loss=0.001, rate_bps=50_000_000_000,
               direction="both", peers=("n2", "192.168.7.0/24"))


# ---------------------------------------------------------------- wire format

@pytest.mark.parametrize("backend", ["netem", "userspace"])
def test_plans_round_trip_through_json(backend):
    topo = plan_topology(3, ipaddress.ip_network("10.213.0.0/24"))
    profile = RICH if backend == "netem" else Profile(name="u", delay_us=1000, loss=0.01, rate_bps=10**8)
    plan = backends.plan_apply(profile, topo, backend, seed=7) + ch.plan_clear(topo)
    text = wire.plan_to_json(plan)
    back = wire.plan_from_json(text)
    assert back == plan
    assert {type(c).__name__ for c in plan} <= set(json.loads(text)["changes"][i]["type"] for i in range(len(plan)))
    if backend == "netem":
        shaped = [c for c in back if isinstance(c, ch.ShapeDevice)]
        assert shaped and all(isinstance(c.peers, tuple) and isinstance(c.netem.ge, tuple) for c in shaped)


@pytest.mark.parametrize("text, message", [
    ("nope", "plan: not JSON"),
    ('{"changes": []}', "plan: version None"),
    ('{"version": 1, "changes": [{"type": "RmRf", "node": "a", "netns": "x"}]}', "plan: unknown change type 'RmRf'"),
    ('{"version": 1, "changes": [{"type": "ClearQdisc", "node": "a", "netns": "x", "ifname": "e", "cmd": "x"}]}',
     "plan: ClearQdisc: unknown field(s) cmd"),
    ('{"version": 1, "changes": [{"type": "ClearQdisc", "node": "a"}]}', "plan: ClearQdisc: "),
    ('{"version": 1, "changes": [{"type": "Change", "node": "a", "netns": "x"}]}', "plan: unknown change type"),
])
def test_bad_plans_are_refused(text, message):
    with pytest.raises(UsageError) as info:
        wire.plan_from_json(text)
    assert info.value.message.startswith(message), info.value.message


# ---------------------------------------------------------------- per-host plans

def test_netem_host_plan_shapes_the_data_interface_and_resolves_peer_hosts():
    topo = remote.hosts_topology(INV)
    profile = dataclasses.replace(RICH, peers=("b",), rate_bps=10**8)
    plan = remote.plan_for_host(profile, INV.host("a"), "netem", topo)
    assert [type(c).__name__ for c in plan] == ["ShapeDevice", "SetIngress", "ShapeDevice"]
    egress, _, ingress = plan
    assert (egress.netns, egress.dev, egress.peers, egress.match) == (HOST_NETNS, "eth1", ("10.9.0.2/32",), "dst")
    assert (ingress.dev, ingress.match) == (ch.ifb_name("eth1"), "src")


def test_userspace_host_plan_is_rate_only():
    topo = remote.hosts_topology(INV)
    plan = remote.plan_for_host(Profile(name="r", rate_bps=100_000_000), INV.host("a"), "userspace", topo)
    assert [type(c).__name__ for c in plan] == ["ClearIngress", "ClearQdisc", "SetTbf"]
    assert (plan[2].ifname, plan[2].rate_bps, plan[2].netns) == ("eth1", 100_000_000, HOST_NETNS)
    with pytest.raises(BackendUnavailable, match="host a: without netem a remote host shapes rate only; "
                                                 "profile d sets delay, loss"):
        remote.plan_for_host(Profile(name="d", delay_us=1000, loss=0.1), INV.host("a"), "userspace", topo)


def test_node_command_quotes_and_uses_sudo_when_asked():
    assert remote.node_command(INV.host("a"), ["reset", "--json"]) == \
        '/opt/nb/bin/netbench node --state-dir /run/netbench --ssh-connection "$SSH_CONNECTION" reset --json'
    assert remote.node_command(INV.host("b"), ["reset"]) == \
        "sudo -n /opt/nb/bin/netbench node --state-dir '/var/lib/nb state' --ssh-connection \"$SSH_CONNECTION\" reset"


def test_node_command_hands_the_login_shells_ssh_connection_past_sudo():
    """sudo's env_reset drops SSH_CONNECTION: the login shell expands it into an argument."""
    import subprocess

    command = remote.node_command(dataclasses.replace(INV.host("b"), venv="/nb venv"), ["info"])
    shown = subprocess.run(["sh", "-c", command.replace("sudo -n ", "printf '%s\\n' ", 1)], text=True,
                           capture_output=True, env={"SSH_CONNECTION": "10.0.0.9 50000 10.0.0.1 22"}).stdout
    assert shown.splitlines() == ["/nb venv/bin/netbench", "node", "--state-dir", "/var/lib/nb state",
                                  "--ssh-connection", "10.0.0.9 50000 10.0.0.1 22", "info"]


# ---------------------------------------------------------------- host side, pure parts

def test_control_path_guard():
    plan = [ch.ClearQdisc("a", HOST_NETNS, "eth0"), ch.SetIngress("a", HOST_NETNS, "eth1", "nbifb-eth1")]
    assert touched_interfaces(plan) == {"eth0", "eth1"}
    guard_control_path(plan, {"eth2"}, force=False)
    with pytest.raises(UsageError, match="plan shapes eth1, which carries this SSH control connection"):
        guard_control_path(plan, {"eth1"}, force=False)
    guard_control_path(plan, {"eth1"}, force=True)
    assert ssh_endpoints({"SSH_CONNECTION": "10.0.0.9 50000 10.0.0.1 22"}) == ("10.0.0.9", "10.0.0.1")
    assert ssh_endpoints({}) is None
    from netbench.remote.agent import _plain_address

    assert [_plain_address(a) for a in ("fe80::1%eth0", "::ffff:10.0.0.1", "10.0.0.1")] == \
        ["fe80::1", "10.0.0.1", "10.0.0.1"]


def test_an_unknown_control_path_refuses_every_plan_unless_forced(tmp_path):
    plan = [ch.ClearQdisc("a", HOST_NETNS, "eth1")]
    with pytest.raises(UsageError, match="cannot tell which interface carries this SSH control connection"):
        guard_control_path(plan, None, force=False)
    guard_control_path(plan, None, force=True)
    journal = Journal(tmp_path / "state")
    with pytest.raises(UsageError, match="cannot tell which interface"):
        apply_plan(plan, journal, environ={})  # sudo without --ssh-connection: no SSH_CONNECTION
    assert not (tmp_path / "state").exists()  # refused before anything was recorded


L = LinkInfo


@pytest.mark.parametrize("ssh_on, protected", [
    ({"br0"}, {"br0", "eth0", "eth1"}),              # a bridge: its ports carry its traffic
    ({"eth0"}, {"eth0", "br0"}),                     # a bridge port: its bridge
    ({"eth2.100"}, {"eth2.100", "eth2"}),            # a VLAN: its parent
    ({"bond0.7"}, {"bond0.7", "bond0", "eth3", "eth4"}),  # a VLAN on a bond: the bond and its slaves
    ({"eth5"}, {"eth5"}),                            # a veth whose peer is in another namespace
])
def test_devices_stacked_with_the_ssh_interface_are_protected(ssh_on, protected):
    links = [L(1, "lo"), L(2, "eth0", master=10), L(3, "eth1", master=10), L(10, "br0"),
             L(4, "eth2"), L(11, "eth2.100", parent=4), L(12, "eth2.200", parent=4),
             L(5, "eth3", master=13), L(6, "eth4", master=13), L(13, "bond0"), L(14, "bond0.7", parent=13),
             L(7, "eth5"), L(8, "eth6")]
    assert stacked_devices(ssh_on, links) == protected


def test_node_passes_the_given_ssh_connection_to_apply_and_info(monkeypatch, tmp_path):
    import netbench.cli.common
    import netbench.remote.agent

    seen = []
    monkeypatch.setattr(netbench.cli.common, "require_root", lambda: None)
    monkeypatch.setattr(netbench.cli.common, "require_testbed", lambda *a: None)
    monkeypatch.setattr(netbench.remote.agent, "apply_plan",
                        lambda plan, journal, **kw: seen.append(("apply", kw["environ"])) or {})
    monkeypatch.setattr(netbench.remote.agent, "host_info",
                        lambda interface, probe, environ: seen.append(("info", environ)) or {})
    plan = wire.plan_to_json([ch.ClearQdisc("a", HOST_NETNS, "eth1")])
    base = ["node", "--state-dir", str(tmp_path)]
    for args in (["--ssh-connection", "10.0.0.9 50000 10.0.0.1 22", "apply", "--json"],
                 ["--ssh-connection", "10.0.0.9 50000 10.0.0.1 22", "info"], ["--ssh-connection", "", "info"]):
        result = CliRunner().invoke(main, base + args, input=plan)
        assert result.exit_code == 0, result.output
    assert seen == [("apply", {"SSH_CONNECTION": "10.0.0.9 50000 10.0.0.1 22"}),
                    ("info", {"SSH_CONNECTION": "10.0.0.9 50000 10.0.0.1 22"}), ("info", None)]
    result = CliRunner().invoke(main, base + ["--ssh-connection", "nonsense", "info"])
    assert result.exit_code == 2 and "--ssh-connection" in result.output


def test_bind_plan_names_the_hosts_namespace_only_where_planned():
    plan = [ch.ClearQdisc("a", HOST_NETNS, "eth1"), ch.ClearQdisc("a", "other", "eth1")]
    assert [c.netns for c in bind_plan(plan, "nbhost-42")] == ["nbhost-42", "other"]


# ---------------------------------------------------------------- leases

def _age_lease(state_dir, seconds_ago):
    """Make the lease's last renewal `seconds_ago` in the past, on the host's boot clock."""
    path = lease.lease_path(state_dir)
    data = json.loads(path.read_text())
    data["renewed"] -= seconds_ago
    path.write_text(json.dumps(data))


def test_lease_expires_and_reverts_only_after_its_duration(tmp_path):
    lease.write(tmp_path, 5)
    start = json.loads(lease.lease_path(tmp_path).read_text())["renewed"]
    clock = {"now": start + 1}
    reverted = []

    def sleep(seconds):
        clock["now"] += seconds

    def revert():
        reverted.append(clock["now"])
        return lease.release(tmp_path)

    outcome = lease.watch(tmp_path, revert, poll_s=0.5, sleep=sleep, now=lambda: clock["now"])
    assert outcome == "expired"
    assert reverted and 5 < reverted[0] - start <= 5.6
    assert not lease.lease_path(tmp_path).exists()


def test_renewal_postpones_expiry_and_release_stops_the_watch(tmp_path):
    lease.write(tmp_path, 1, holder="c1")
    _age_lease(tmp_path, 10)
    assert lease.read(tmp_path).expired
    assert lease.renew(tmp_path, "c1") == lease.RENEWED
    state = lease.read(tmp_path)
    assert state.held and not state.expired and state.remaining_s > 0.5 and state.holder == "c1"
    lease.release(tmp_path)
    assert lease.renew(tmp_path, "c1") == lease.GONE  # the host reverted: the controller learns it lost it
    reverted = []
    assert lease.watch(tmp_path, lambda: reverted.append(1)) == "released" and not reverted


def test_lease_age_ignores_wall_clock_jumps(tmp_path, monkeypatch):
    """The lease counts on CLOCK_BOOTTIME, stored in the file, so an NTP step or a date
    change neither expires a live lease nor keeps a dead one alive."""
    lease.write(tmp_path, 60, holder="c1")
    data = json.loads(lease.lease_path(tmp_path).read_text())
    assert abs(data["renewed"] - time.clock_gettime(time.CLOCK_BOOTTIME)) < 5
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # the wall clock jumps an hour ahead
    assert not lease.read(tmp_path).expired
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    _age_lease(tmp_path, 61)
    assert lease.read(tmp_path).expired


def test_a_lease_from_before_a_reboot_is_expired(tmp_path):
    lease.write(tmp_path, 60)
    data = json.loads(lease.lease_path(tmp_path).read_text())
    data["boot_id"], data["renewed"] = "another-boot", 1.0
    lease.lease_path(tmp_path).write_text(json.dumps(data))
    assert lease.read(tmp_path).expired


def test_renewal_runs_in_its_own_process_and_refuses_another_holders_lease(tmp_path):
    import subprocess
    import sys

    lease.write(tmp_path, 30, holder="c1")
    _age_lease(tmp_path, 20)

    def renew(holder):
        return subprocess.run([sys.executable, "-m", "netbench.state.lease", "renew", str(tmp_path), holder],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})

    done = renew("c1")
    assert done.returncode == lease.RENEWED, done.stderr
    assert lease.read(tmp_path).remaining_s > 25
    taken = renew("c2")
    assert taken.returncode == lease.TAKEN and "c1" in taken.stdout
    lease.release(tmp_path)
    assert renew("c1").returncode == lease.GONE


def test_a_failed_revert_is_retried(tmp_path):
    lease.write(tmp_path, 1)
    _age_lease(tmp_path, 5)
    attempts, errors = [], []

    def revert():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("tc: device busy")
        return lease.release(tmp_path)

    outcome = lease.watch(tmp_path, revert, sleep=lambda s: None, on_error=errors.append)
    assert outcome == "expired" and len(attempts) == 2
    assert [str(e) for e in errors] == ["tc: device busy"]


def test_the_watcher_does_not_revert_a_lease_renewed_while_it_waited_for_the_lock(tmp_path, monkeypatch):
    """The watcher sees an expired lease, but an apply holds the lock and takes a fresh
    lease; once it has the lock, the watcher looks again and goes on watching."""
    import threading

    from netbench.remote import agent as remote_node
    from netbench.state.journal import Journal, Lock

    journal = Journal(tmp_path)
    lease.write(tmp_path, 1, holder="c1")
    _age_lease(tmp_path, 5)
    wants_lock, resets = threading.Event(), []
    real_lock = remote_node.Lock

    class SignallingLock(real_lock):
        def __enter__(self):
            wants_lock.set()
            return super().__enter__()

    monkeypatch.setattr(remote_node, "Lock", SignallingLock)
    monkeypatch.setattr(remote_node, "reset_host", lambda j, keep_pid=None: resets.append(1) or lease.release(j.dir))
    outcome = []
    with Lock(tmp_path):  # an apply in progress
        watcher = threading.Thread(target=lambda: outcome.append(remote_node.watch_lease(journal)), daemon=True)
        watcher.start()
        assert wants_lock.wait(10)
        lease.write(tmp_path, 60, holder="c1")  # the apply's fresh lease
    time.sleep(0.5)  # let the watcher take the lock and look again (the outcome does not depend on it)
    lease.release(tmp_path)
    watcher.join(10)
    assert outcome == ["released"] and not resets


def test_lease_keeper_reports_a_host_whose_lease_is_gone_or_taken_over():
    a = FakeHost("a", [("netbench.state.lease renew", CommandResult(0, "", ""))])
    b = FakeHost("b", [("netbench.state.lease renew", CommandResult(lease.GONE, "", ""))])
    keeper = leases.LeaseKeeper(INV, [a, b], seconds=3, holder="me@ctl:1:ab")
    keeper.renew_once()
    assert keeper.lost == {"b": "its lease had expired and it reverted its shaping"}
    assert a.commands[0][0] == "/opt/nb/bin/python -m netbench.state.lease renew /run/netbench me@ctl:1:ab"
    assert b.commands[0][0] == "sudo -n /opt/nb/bin/python -m netbench.state.lease renew '/var/lib/nb state' me@ctl:1:ab"
    c = FakeHost("a", [("netbench.state.lease renew", CommandResult(lease.TAKEN, "held by them@other:2:cd\n", ""))])
    keeper = leases.LeaseKeeper(INV, [c], seconds=3, holder="me@ctl:1:ab")
    keeper.renew_once()
    assert keeper.lost == {"a": "another controller took it over (held by them@other:2:cd)"}


def test_one_stalled_or_broken_host_does_not_stop_renewals_for_the_others():
    import threading

    release = threading.Event()

    def stall(command, input):
        release.wait(30)
        return CommandResult(0, "", "")

    def broken(command, input):
        raise RuntimeError("paramiko: SSHException leaked")

    stalled = FakeHost("a", [("netbench.state.lease renew", stall)])
    crashing = FakeHost("b", [("netbench.state.lease renew", broken)])
    healthy = FakeHost("c", [("netbench.state.lease renew", CommandResult(0, "", ""))])
    inv = inventory_from_mapping({"defaults": {"interface": "eth1"},
                                  "hosts": {n: {"ssh": n} for n in ("a", "b", "c")}}, "inv.yaml")
    keeper = leases.LeaseKeeper(inv, [stalled, crashing, healthy], seconds=0.6, holder="me")
    try:
        with keeper:
            deadline = time.monotonic() + 20
            while len(healthy.commands) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(healthy.commands) >= 3  # renewed again and again while a hangs and b raises
            assert len(crashing.commands) >= 2 and keeper._thread.is_alive()
            assert len(stalled.commands) == 1  # one renewal at a time per host
            assert "RuntimeError: paramiko: SSHException leaked" in keeper.failures["b"]
            assert "no answer within" in keeper.failures["a"]
            assert not keeper.lost
    finally:
        release.set()


def test_fabric_sessions_bound_channel_opens_and_send_keepalives():
    from types import SimpleNamespace

    from netbench.remote import ssh as transport_mod

    calls = []
    transport = SimpleNamespace(channel_timeout=3600, set_keepalive=lambda s: calls.append(s))
    fake_conn = SimpleNamespace(is_connected=True, transport=transport,
                                run=lambda command, **kw: SimpleNamespace(exited=0, stdout="ok", stderr=""))
    host = object.__new__(transport_mod.FabricHost)
    host.name, host.conn = "a", fake_conn
    assert host.run("true", timeout=1).ok
    assert transport.channel_timeout == transport_mod.CONNECT_TIMEOUT_S
    assert calls == [transport_mod.KEEPALIVE_S]


def test_a_lease_too_short_for_the_host_count_is_refused_naming_the_flag(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a: {ssh: 192.0.2.1, interface: eth1}\n  b: {ssh: 192.0.2.2, interface: eth1}\n")
    result = CliRunner().invoke(main, ["apply", "--inventory", str(path), "--bandwidth", "1mbit", "--lease", "1"])
    assert result.exit_code == 2
    assert "flag --lease: 1 s is too short for 2 host(s)" in result.output
    assert leases.min_lease_s(2) == 1.5 and leases.min_lease_s(17) == 3.0


# ---------------------------------------------------------------- orchestration over fake hosts

def _info(backend="userspace"):
    return ok_json({"backend": backend, "backend_reason": "probe", "interface_ok": True,
                    "interfaces": {"eth1": []}, "netbench": "0.1.0"})


def test_apply_sends_each_host_its_plan_with_the_lease():
    hosts = [FakeHost(n, [("node --state-dir", None)]) for n in ("a", "b")]
    for host in hosts:
        host.responses = [(" info ", _info()), (" apply ", ok_json({"applied": []}))]
    planned = remote.plan_inventory(INV, hosts, Profile(name="r", rate_bps=10**8), None)
    remote.apply_inventory(INV, hosts, planned, lease_s=30)
    for host in hosts:
        (command, plan_json), = host.ran(" apply ")
        assert command.endswith("apply --json --lease 30")
        sent = wire.plan_from_json(plan_json)
        assert [type(c).__name__ for c in sent] == ["ClearIngress", "ClearQdisc", "SetTbf"]
        assert sent[2].rate_bps == 10**8


def test_a_failing_host_rolls_back_the_others_and_names_itself():
    a = FakeHost("a", [(" info ", _info()), (" apply ", ok_json({})), (" reset ", ok_json({"removed": ["qdisc"]}))])
    b = FakeHost("b", [(" info ", _info()), (" apply ", failed("plan shapes eth1, which carries this SSH control connection"))])
    planned = remote.plan_inventory(INV, [a, b], Profile(name="r", rate_bps=10**8), None)
    with pytest.raises(remote.RemoteError, match="^host b: plan shapes eth1, which carries this SSH control") as info:
        remote.apply_inventory(INV, [a, b], planned)
    assert info.value.hint == "something to do" and info.value.exit_code == 1
    assert a.ran(" reset ") and not b.ran(" reset ")


def test_apply_names_its_holder_and_passes_takeover():
    hosts = [FakeHost(n, [(" info ", _info()), (" apply ", ok_json({"applied": []}))]) for n in ("a", "b")]
    planned = remote.plan_inventory(INV, hosts, Profile(name="r", rate_bps=10**8), None)
    remote.apply_inventory(INV, hosts, planned, lease_s=30, holder="me@ctl:1:ab", takeover=True)
    for host in hosts:
        (command, _), = host.ran(" apply ")
        assert command.endswith("apply --json --lease 30 --holder me@ctl:1:ab --takeover")


def test_a_failed_reset_of_the_others_does_not_hide_the_apply_error():
    a = FakeHost("a", [(" info ", _info()), (" apply ", ok_json({})), (" reset ", failed("reset broke"))])
    b = FakeHost("b", [(" info ", _info()), (" apply ", failed("tc: quantum too big"))])
    planned = remote.plan_inventory(INV, [a, b], Profile(name="r", rate_bps=10**8), None)
    with pytest.raises(remote.RemoteError, match="^host b: tc: quantum too big") as info:
        remote.apply_inventory(INV, [a, b], planned)
    assert "host a: reset broke" in info.value.hint


class _FailingExecutor:
    """Journals and makes the first change, then fails on the second (as a kernel refusal would)."""

    def __init__(self, journal):
        self.journal = journal

    def apply(self, plan):
        self.journal.record("qdisc", netns="nbhost-test-none", ifname="eth1", handle="4e42:")
        raise EmulationError("netlink: Invalid argument (tbf burst)")


def _host_apply(tmp_path, monkeypatch, executor=None, **kwargs):
    """`apply_plan` on a journal in tmp_path with the kernel left out: returns the journal,
    the plans the executor got, and a function that applies (keywords override)."""
    from netbench.remote import agent as remote_node
    from netbench.emulation import executor as apply_mod
    from netbench.state.journal import Journal

    journal = Journal(tmp_path)
    applied = []

    class Recorder:
        def __init__(self, journal):
            self.journal = journal

        def apply(self, plan):
            applied.append(plan)

    monkeypatch.setattr(remote_node, "attach_own_netns", lambda j: "nbhost-test-none")
    monkeypatch.setattr(remote_node, "_ensure_watcher", lambda j: 4242)
    monkeypatch.setattr(remote_node, "control_interfaces", lambda environ: {"eth0"})  # SSH arrives on eth0
    monkeypatch.setattr(apply_mod, "real_executor", lambda j, detach_engines=False: (executor or Recorder)(j))
    plan = [ch.ClearQdisc("a", HOST_NETNS, "eth1")]
    return journal, applied, lambda **more: remote_node.apply_plan(plan, journal, environ={}, **{**kwargs, **more})


def test_a_host_whose_apply_fails_undoes_its_own_changes(tmp_path, monkeypatch):
    journal, _, apply = _host_apply(tmp_path, monkeypatch, executor=_FailingExecutor, lease_s=30, holder="c1")
    with pytest.raises(EmulationError, match="tbf burst"):
        apply()
    assert journal.pending() == [] and not lease.read(tmp_path).held


def test_a_failed_undo_does_not_hide_the_apply_error(tmp_path, monkeypatch):
    from netbench.remote import agent as remote_node
    from netbench.errors import StateError

    _, _, apply = _host_apply(tmp_path, monkeypatch, executor=_FailingExecutor, lease_s=30, holder="c1")

    def broken_reset(journal, keep_pid=None):
        raise StateError("journal unreadable")

    monkeypatch.setattr(remote_node, "reset_host", broken_reset)
    with pytest.raises(EmulationError, match="tbf burst") as info:
        apply()
    assert "journal unreadable" in info.value.hint


def test_node_apply_refuses_a_lease_another_controller_holds_unless_taken_over(tmp_path, monkeypatch):
    from netbench.errors import StateError

    lease.write(tmp_path, 60, holder="them@other:2:cd")
    journal, applied, apply = _host_apply(tmp_path, monkeypatch, lease_s=30, holder="me@ctl:1:ab")
    with pytest.raises(StateError, match=r"lease held by them@other:2:cd since .*, expires in 6\d s") as info:
        apply()
    assert "--takeover" in info.value.hint
    assert not applied and lease.read(tmp_path).holder == "them@other:2:cd"
    with pytest.raises(StateError, match="lease held by them@other"):
        apply(lease_s=0)  # no lease of its own: still someone else's shaping
    apply(takeover=True)
    assert applied and lease.read(tmp_path).holder == "me@ctl:1:ab"
    apply()  # its own lease: a sweep's next run re-applies freely
    assert len(applied) == 2


def test_node_apply_takes_over_an_expired_lease_without_asking(tmp_path, monkeypatch):
    lease.write(tmp_path, 1, holder="them@other:2:cd")
    _age_lease(tmp_path, 5)
    _, applied, apply = _host_apply(tmp_path, monkeypatch, lease_s=30, holder="me@ctl:1:ab")
    apply()
    assert applied and lease.read(tmp_path).holder == "me@ctl:1:ab"


def test_takeover_needs_an_inventory():
    result = CliRunner().invoke(main, ["apply", "--latency", "1ms", "--takeover"])
    assert result.exit_code == 2 and "flag --takeover: only with --inventory" in result.output
    result = CliRunner().invoke(main, ["sweep", "--latency", "1ms", "--takeover", "--dry-run"])
    assert result.exit_code == 2 and "flag --takeover: only with --inventory" in result.output


def test_missing_interface_and_missing_netbench_are_reported_per_host():
    a = FakeHost("a", [(" info ", ok_json({"backend": "netem", "interface_ok": False, "interfaces": {"lo": [], "ens3": []}}))])
    b = FakeHost("b", [(" info ", _info())])
    with pytest.raises(remote.RemoteError, match=r"host a: no interface eth1 there \(it has ens3, lo\)"):
        remote.plan_inventory(INV, [a, b], Profile(name="r", rate_bps=10**8), None)
    c = FakeHost("a")  # nothing answers: exit 127
    with pytest.raises(remote.RemoteError, match="host a: netbench is not installed there") as info:
        remote.call_node(c, INV.host("a"), ["info"])
    assert "provision" in info.value.hint


def test_netem_requested_on_a_host_without_it():
    a, b = FakeHost("a", [(" info ", _info("userspace"))]), FakeHost("b", [(" info ", _info("netem"))])
    with pytest.raises(BackendUnavailable, match="host a: --backend netem: probe"):
        remote.plan_inventory(INV, [a, b], Profile(name="r", rate_bps=10**8), "netem")


def test_doctor_rows_for_a_reachable_root_host_with_a_version_mismatch():
    host = FakeHost("a", [("id -u", CommandResult(0, "0\n", "")), ("--version", CommandResult(0, "Python 3.11.2\n", "")),
                          (" info ", ok_json({"netbench": "0.0.9", "tensorflow": None, "interface_ok": True,
                                              "interfaces": {"eth1": ["10.9.0.1/24"]}, "control_interfaces": ["eth0"],
                                              "backend": "netem", "backend_reason": "accepted"}))])
    rows = {check: (status, detail) for check, status, detail in remote.doctor_host(host, INV.host("a"), None)}
    assert rows["reachable"][0] == rows["root"][0] == rows["python"][0] == "ok"
    assert rows["netbench"] == ("mismatch", "0.0.9 (controller 0.1.0)")
    assert rows["interface"] == ("ok", "eth1: 10.9.0.1/24")
    assert rows["control path"][0] == "unknown"  # that netbench does not say whether it knows
    assert rows["backend"][0] == "ok"


@pytest.mark.parametrize("known, control, status", [(True, ["eth0"], "ok"), (True, ["eth0", "eth1"], "missing"),
                                                    (False, [], "unknown")])
def test_doctor_control_path_row_says_what_the_host_knows(known, control, status):
    host = FakeHost("a", [("id -u", CommandResult(0, "0\n", "")), ("--version", CommandResult(0, "Python 3\n", "")),
                          (" info ", ok_json({"netbench": "0.1.0", "interface_ok": True, "interfaces": {"eth1": []},
                                              "control_interfaces": control, "control_path_known": known,
                                              "backend": "netem", "backend_reason": "accepted"}))])
    rows = {check: (s, detail) for check, s, detail in remote.doctor_host(host, INV.host("a"), None)}
    assert rows["control path"][0] == status
    if known:
        assert rows["control path"][1] == f"SSH arrives on {', '.join(control)}; shaping eth1"


# ---------------------------------------------------------------- CLI

def test_remote_only_flags_need_an_inventory():
    result = CliRunner().invoke(main, ["apply", "--latency", "1ms", "--lease", "5"])
    assert result.exit_code == 2 and "flag --lease: only with --inventory" in result.output
    result = CliRunner().invoke(main, ["show", "--insecure-host-keys"])
    assert result.exit_code == 2 and "flag --insecure-host-keys: only with --inventory" in result.output


def test_node_apply_refuses_a_bad_plan_before_touching_anything(tmp_path):
    result = CliRunner().invoke(main, ["node", "--state-dir", str(tmp_path), "apply", "--json"], input="{")
    assert result.exit_code == 2 and "plan: not JSON" in result.output
    assert not list(tmp_path.iterdir())


def test_every_node_command_has_help():
    for name in ("apply", "show", "reset", "info", "lease-watch"):
        result = CliRunner().invoke(main, ["node", name, "--help"])
        assert result.exit_code == 0 and "Example:" in result.output
    assert "Example:" in CliRunner().invoke(main, ["provision", "--help"]).output


# ---------------------------------------------------------------- provision

PROVISION_INV = inventory_from_mapping({
    "defaults": {"interface": "eth1"},
    "hosts": {"a": {"ssh": "10.0.0.1", "venv": "/opt/nb env; touch /tmp/pwned"},
              "b": {"ssh": "10.0.0.2", "sudo": True, "venv": "/opt/it's"}}}, "inv.yaml")
STAGE = "/tmp/netbench-provision.Xy12Ab"


def _provision_host(name: str, stat: str = "1000 700 directory\n1000\n") -> FakeHost:
    return FakeHost(name, [("mktemp -d", CommandResult(0, STAGE + "\n", "")), ("stat -c", CommandResult(0, stat, "")),
                           (" --version", CommandResult(0, "netbench, version 0.1.0\n", "")),
                           ("", CommandResult(0, "", ""))])


def _provision(monkeypatch, tmp_path, hosts, pip_args="--no-index --find-links '/srv/my wheels'"):
    import netbench.remote.controller

    opened = []
    monkeypatch.setattr(netbench.remote.controller, "open_inventory",
                        lambda path, insecure: opened.append(path) or (PROVISION_INV, hosts))
    wheel = tmp_path / "netbench-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    result = CliRunner().invoke(main, ["provision", "--inventory", "inv.yaml", "--wheel", str(wheel),
                                       "--pip-args", pip_args])
    return result, opened


def test_provision_stages_in_a_private_folder_and_quotes_every_word(monkeypatch, tmp_path):
    import shlex

    hosts = [_provision_host("a"), _provision_host("b")]
    result, _ = _provision(monkeypatch, tmp_path, hosts)
    assert result.exit_code == 0, result.output
    for host in hosts:
        venv = PROVISION_INV.host(host.name).venv
        sudo = ["sudo", "-n"] if host.name == "b" else []
        argvs = [shlex.split(command) for command, _ in host.commands]
        assert argvs[0][:2] == ["mktemp", "-d"]  # a fresh folder, not a predictable name
        assert argvs[1][:4] == ["stat", "-c", "%u %a %F", "--"] and argvs[1][4] == STAGE
        assert [remote for _, remote in host.puts] == [f"{STAGE}/netbench-0.1.0-py3-none-any.whl",
                                                       f"{STAGE}/constraints.txt"]
        (make_venv,) = [a for a in argvs if "-c" in a and a[len(sudo)] == "sh"]
        assert make_venv[:len(sudo) + 2] == sudo + ["sh", "-c"]
        assert shlex.split(make_venv[-1]) == ["test", "-x", f"{venv}/bin/python", "||",
                                              "python3", "-m", "venv", venv]
        (pip,) = [a for a in argvs if "install" in a]
        assert pip == sudo + [f"{venv}/bin/pip", "install", "-q", "--disable-pip-version-check",
                              "-c", f"{STAGE}/constraints.txt", "--no-index", "--find-links", "/srv/my wheels",
                              f"{STAGE}/netbench-0.1.0-py3-none-any.whl"]
        assert argvs[-1] == ["rm", "-rf", "--", STAGE]


@pytest.mark.parametrize("stat, why", [("0 700 directory\n1000\n", "owned by uid 0"),
                                       ("1000 777 directory\n1000\n", "mode 777"),
                                       ("1000 700 symbolic link\n1000\n", "symbolic link")])
def test_provision_refuses_a_staging_folder_others_could_change(monkeypatch, tmp_path, stat, why):
    hosts = [_provision_host("a", stat), _provision_host("b")]
    result, _ = _provision(monkeypatch, tmp_path, hosts)
    assert result.exit_code == 1
    assert f"host a: staging folder {STAGE} is not private" in result.output and why in result.output
    assert not hosts[0].puts and not hosts[0].ran("install") and not hosts[0].ran("rm ")
    assert hosts[1].ran("install")  # the other host is still provisioned


def test_provision_refuses_unparsable_pip_args_before_contacting_any_host(monkeypatch, tmp_path):
    result, opened = _provision(monkeypatch, tmp_path, [_provision_host("a")], pip_args="--find-links '/srv")
    assert result.exit_code == 2 and "--pip-args" in result.output and not opened


# ---------------------------------------------------------------- SSH connections

def test_every_proxyjump_hop_checks_host_keys_like_the_host(tmp_path):
    from paramiko import AutoAddPolicy, RejectPolicy

    from netbench.remote.ssh import FabricHost

    (tmp_path / "ssh_config").write_text("Host target\n  HostName 10.0.0.5\n  ProxyJump jump1,jump2\n"
                                         "Host jump1\n  HostName 10.0.0.6\n")
    import base64
    import struct

    blob = b"".join(struct.pack(">I", len(part)) + part for part in (b"ssh-ed25519", bytes(range(32))))
    (tmp_path / "known_hosts").write_text(f"10.0.0.6 ssh-ed25519 {base64.b64encode(blob).decode()}\n")
    inv = inventory_from_mapping({"known_hosts": str(tmp_path / "known_hosts"),
                                  "ssh_config": str(tmp_path / "ssh_config"),
                                  "hosts": {"t": {"ssh": "target", "interface": "eth1"}}}, "inv.yaml")
    for insecure, policy in ((False, RejectPolicy), (True, AutoAddPolicy)):
        conn, hops = FabricHost(inv.hosts[0], inv, insecure_host_keys=insecure).conn, []
        while conn is not None:
            hops.append(conn)
            conn = conn.gateway
        assert [h.host for h in hops] == ["10.0.0.5", "10.0.0.6", "jump2"]
        for hop in hops:
            assert isinstance(hop.client._policy, policy), hop.host
            assert hop.client._system_host_keys.lookup("10.0.0.6"), hop.host  # the inventory's known_hosts


# ---------------------------------------------------------------- what hosts send is checked

def _raising(exc):
    def answer(command, input):
        raise exc
    return answer


def test_any_exception_on_one_host_is_reported_naming_it_and_the_others_still_run():
    a = FakeHost("a", [(" reset ", _raising(EOFError("channel closed")))])
    b = FakeHost("b", [(" reset ", ok_json({"removed": ["qdisc"]}))])
    results = remote.in_parallel([a, b], lambda c: remote.call_node(c, INV.host(c.name), ["reset", "--json"]))
    assert isinstance(results["a"], remote.RemoteError)
    assert results["a"].message == "host a: EOFError: channel closed"
    assert results["b"] == {"removed": ["qdisc"]} and b.ran(" reset ")
    with pytest.raises(ResetIncomplete, match="host a: EOFError: channel closed$") as failed:
        remote.reset_inventory(INV, [a, b])
    assert failed.value.failures == ["host a: EOFError: channel closed"]
    assert failed.value.removed == {"b": ["qdisc"]}  # what the others removed is kept for the report


@pytest.mark.parametrize("command, answer, problem", [
    ("info", [], "not a JSON object"),
    ("info", {"interfaces": ["eth1"]}, "'interfaces' is not an object of address lists"),
    ("info", {"interfaces": {"eth1": []}, "interface_ok": "yes"}, "'interface_ok' is not true or false"),
    ("info", {"backend": "netem"}, "no 'interfaces'"),
    ("reset", {"removed": "qdisc"}, "'removed' is not a list of strings"),
    ("reset", {}, "no 'removed'"),
    ("show", {"nodes": [{"node": "a"}], "lease": None}, "'lease' is not a lease object"),
    ("show", {"nodes": [{"node": "a", "profile": 7}], "lease": {"held": False}}, "'nodes' is not a list of node rows"),
    ("apply", "done", "not a JSON object"),
])
def test_node_answers_of_the_wrong_shape_are_a_clear_error_naming_the_host(command, answer, problem):
    host = FakeHost("a", [(f" {command} ", ok_json(answer))])
    with pytest.raises(remote.RemoteError) as info:
        remote.call_node(host, INV.host("a"), [command, "--json"])
    assert info.value.message == f"host a: 'netbench node {command}' answered JSON of the wrong shape: {problem}"


def test_a_wrong_answer_fails_the_command_line_with_one_line_not_a_traceback(monkeypatch):
    import netbench.remote.controller

    hosts = [FakeHost("a", [(" show ", ok_json({"nodes": [], "lease": "held"}))]),
             FakeHost("b", [(" show ", ok_json({"nodes": [], "lease": {"held": False}}))])]
    monkeypatch.setattr(netbench.remote.controller, "open_inventory", lambda path, insecure: (INV, hosts))
    result = CliRunner().invoke(main, ["show", "--inventory", "inv.yaml"])
    assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit)
    assert "host a: 'netbench node show' answered JSON of the wrong shape: 'lease' is not a lease object" \
        in result.output
    assert "Traceback" not in result.output
# ---------------------------------------------------------------- what hosts say is printed as written


def test_host_answers_with_brackets_are_printed_as_written(monkeypatch):
    from netbench.remote import controller as remote_controller

    removed = ["tbf qdisc [/] on eth1", "process [bold]1234[/bold]"]
    hosts = [FakeHost("a", [(" reset ", ok_json({"removed": removed}))]),
             FakeHost("b", [(" reset ", ok_json({"removed": []}))])]
    monkeypatch.setattr(remote_controller, "open_inventory", lambda path, insecure: (INV, hosts))
    result = CliRunner().invoke(main, ["reset", "--inventory", "inv.yaml"])
    assert result.exit_code == 0, result.output
    assert "a: removed tbf qdisc [/] on eth1" in result.stdout
    assert "a: removed process [bold]1234[/bold]" in result.stdout


def test_host_show_with_brackets_is_printed_as_written(monkeypatch):
    from netbench.remote import controller as remote_controller

    row = {"node": "a", "backend": "netem", "qdisc": {"drops": 0}, "engine": None,
           "profile": {"name": "x", "delay": "[/]", "peers": ["[red]n2"]}}
    shown = {"host": "a", "interface": "eth1", "nodes": [row], "lease": {"held": False}, "watchers": [], "pending": []}
    hosts = [FakeHost("a", [(" show ", ok_json(shown))]), FakeHost("b", [(" show ", ok_json(shown))])]
    monkeypatch.setattr(remote_controller, "open_inventory", lambda path, insecure: (INV, hosts))
    result = CliRunner().invoke(main, ["show", "--inventory", "inv.yaml"], terminal_width=300)
    assert result.exit_code == 0, result.output
    assert "[/]" in result.stdout and "[red]n2" in result.stdout


def test_a_host_makes_the_controllers_plan_in_place_against_its_own_journal(tmp_path, monkeypatch):
    """The controller plans without the host's journal; the host drops the clears of what it
    does not hold and the clear a tbf on the same device replaces in place."""
    from netbench.remote import agent as remote_node

    journal, applied, _ = _host_apply(tmp_path, monkeypatch)
    plan = [ch.ClearIngress("a", HOST_NETNS, "eth1", "nbifb-eth1"), ch.ClearQdisc("a", HOST_NETNS, "eth1"),
            ch.SetTbf("a", HOST_NETNS, "eth1", 10_000_000, 15140, 62500)]
    result = remote_node.apply_plan(plan, journal, environ={})
    assert [type(c).__name__ for c in applied[-1]] == ["SetTbf"] and applied[-1][0].netns == "nbhost-test-none"
    assert len(result["applied"]) == 1
    journal.record("qdisc", netns="nbhost-test-none", ifname="eth1", handle="4e42:", qdisc_kind="tbf")
    remote_node.apply_plan(plan[:2], journal, environ={})  # held and no longer wanted: cleared
    assert [type(c).__name__ for c in applied[-1]] == ["ClearQdisc"]


def test_a_controllers_reset_leaves_a_host_another_controller_took_over(tmp_path):
    """`node reset --holder H` removes nothing while another holder's lease stands (a takeover
    between the keeper's last renewal and the run's reset), and resets as before otherwise."""
    from netbench.remote.agent import held_by_another

    lease.write(tmp_path, 60, holder="c2")
    assert held_by_another(lease.read(tmp_path), "c1") == "c2"
    assert held_by_another(lease.read(tmp_path), "c2") is None and held_by_another(lease.read(tmp_path), None) is None
    taken = CliRunner().invoke(main, ["node", "--state-dir", str(tmp_path), "reset", "--json", "--holder", "c1"])
    assert taken.exit_code == 0, taken.output
    assert json.loads(taken.output) == {"removed": [], "held_by": "c2"} and lease.read(tmp_path).held
    _age_lease(tmp_path, 61)  # c2 is gone: its lease ran out
    ours = CliRunner().invoke(main, ["node", "--state-dir", str(tmp_path), "reset", "--json", "--holder", "c1"])
    assert json.loads(ours.output) == {"removed": ["lease"]} and not lease.read(tmp_path).held
    assert remote.answer_problem("reset", {"removed": [], "held_by": 3}) is not None
