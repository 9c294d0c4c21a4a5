"""Remote mode without SSH: wire format, per-host plans, control-path guard, leases, and the
controller's orchestration against FakeHost (tests/remote_fakes.py)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import time

import pytest
from click.testing import CliRunner
from tests.remote_fakes import FakeHost, failed, ok_json

from netbench import lease, remote
from netbench.cli import main
from netbench.emulation import changes as ch
from netbench.emulation import wire
from netbench.errors import BackendUnavailable, EmulationError, UsageError
from netbench.inventory import inventory_from_mapping
from netbench.profile import Profile
from netbench.remote_node import HOST_NETNS, bind_plan, guard_control_path, ssh_endpoints, touched_interfaces
from netbench.testbed.remote import CommandResult
from netbench.testbed.topology import plan_topology

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
    plan = ch.plan_apply(profile, topo, backend, seed=7) + ch.plan_clear(topo)
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
        "/opt/nb/bin/netbench node --state-dir /run/netbench reset --json"
    assert remote.node_command(INV.host("b"), ["reset"]) == \
        "sudo -n /opt/nb/bin/netbench node --state-dir '/var/lib/nb state' reset"


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
        return subprocess.run([sys.executable, "-m", "netbench.lease", "renew", str(tmp_path), holder],
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

    from netbench import remote_node
    from netbench.journal import Journal, Lock

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
    a = FakeHost("a", [("netbench.lease renew", CommandResult(0, "", ""))])
    b = FakeHost("b", [("netbench.lease renew", CommandResult(lease.GONE, "", ""))])
    keeper = remote.LeaseKeeper(INV, [a, b], seconds=3, holder="me@ctl:1:ab")
    keeper.renew_once()
    assert keeper.lost == {"b": "its lease had expired and it reverted its shaping"}
    assert a.commands[0][0] == "/opt/nb/bin/python -m netbench.lease renew /run/netbench me@ctl:1:ab"
    assert b.commands[0][0] == "sudo -n /opt/nb/bin/python -m netbench.lease renew '/var/lib/nb state' me@ctl:1:ab"
    c = FakeHost("a", [("netbench.lease renew", CommandResult(lease.TAKEN, "held by them@other:2:cd\n", ""))])
    keeper = remote.LeaseKeeper(INV, [c], seconds=3, holder="me@ctl:1:ab")
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

    stalled = FakeHost("a", [("netbench.lease renew", stall)])
    crashing = FakeHost("b", [("netbench.lease renew", broken)])
    healthy = FakeHost("c", [("netbench.lease renew", CommandResult(0, "", ""))])
    inv = inventory_from_mapping({"defaults": {"interface": "eth1"},
                                  "hosts": {n: {"ssh": n} for n in ("a", "b", "c")}}, "inv.yaml")
    keeper = remote.LeaseKeeper(inv, [stalled, crashing, healthy], seconds=0.6, holder="me")
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

    from netbench.testbed import remote as transport_mod

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
    assert remote.min_lease_s(2) == 1.5 and remote.min_lease_s(17) == 3.0


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
    from netbench import remote_node
    from netbench.emulation import apply as apply_mod
    from netbench.journal import Journal

    journal = Journal(tmp_path)
    applied = []

    class Recorder:
        def __init__(self, journal):
            self.journal = journal

        def apply(self, plan):
            applied.append(plan)

    monkeypatch.setattr(remote_node, "attach_own_netns", lambda j: "nbhost-test-none")
    monkeypatch.setattr(remote_node, "_ensure_watcher", lambda j: 4242)
    monkeypatch.setattr(apply_mod, "real_executor", lambda j, detach_engines=False: (executor or Recorder)(j))
    plan = [ch.ClearQdisc("a", HOST_NETNS, "eth1")]
    return journal, applied, lambda **more: remote_node.apply_plan(plan, journal, environ={}, **{**kwargs, **more})


def test_a_host_whose_apply_fails_undoes_its_own_changes(tmp_path, monkeypatch):
    journal, _, apply = _host_apply(tmp_path, monkeypatch, executor=_FailingExecutor, lease_s=30, holder="c1")
    with pytest.raises(EmulationError, match="tbf burst"):
        apply()
    assert journal.pending() == [] and not lease.read(tmp_path).held


def test_a_failed_undo_does_not_hide_the_apply_error(tmp_path, monkeypatch):
    from netbench import remote_node
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
    assert rows["control path"][0] == "ok" and rows["backend"][0] == "ok"


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
