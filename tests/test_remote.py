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
from netbench.errors import BackendUnavailable, UsageError
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

def test_lease_expires_and_reverts_only_after_its_duration(tmp_path):
    lease.write(tmp_path, 5)
    mtime = os.stat(lease.lease_path(tmp_path)).st_mtime
    clock = {"now": mtime + 1}
    reverted = []

    def sleep(seconds):
        clock["now"] += seconds

    outcome = lease.watch(tmp_path, lambda: reverted.append(clock["now"]), poll_s=0.5, sleep=sleep,
                          now=lambda: clock["now"])
    assert outcome == "expired"
    assert reverted and 5 < reverted[0] - mtime <= 5.6
    assert not lease.lease_path(tmp_path).exists()


def test_renewal_postpones_expiry_and_release_stops_the_watch(tmp_path):
    lease.write(tmp_path, 1)
    os.utime(lease.lease_path(tmp_path), (time.time() - 10, time.time() - 10))
    assert lease.read(tmp_path).expired
    os.utime(lease.lease_path(tmp_path))  # what the controller's renewal (touch) does
    state = lease.read(tmp_path)
    assert state.held and not state.expired and state.remaining_s > 0.5
    lease.release(tmp_path)
    reverted = []
    assert lease.watch(tmp_path, lambda: reverted.append(1)) == "released" and not reverted
    assert lease.renew_command("/a b/lease.json") == "test -f '/a b/lease.json' && touch '/a b/lease.json'"


def test_lease_keeper_reports_a_host_whose_lease_is_gone():
    a = FakeHost("a", [("touch", CommandResult(0, "", ""))])
    b = FakeHost("b", [("touch", CommandResult(1, "", ""))])
    keeper = remote.LeaseKeeper(INV, [a, b], seconds=3)
    keeper.renew_once()
    assert keeper.lost == {"b": "its lease had expired and it reverted its shaping"}
    assert a.commands[0][0] == "test -f /run/netbench/lease.json && touch /run/netbench/lease.json"
    assert b.commands[0][0] == "sudo -n sh -c 'test -f '\"'\"'/var/lib/nb state/lease.json'\"'\"' && touch '\"'\"'/var/lib/nb state/lease.json'\"'\"''"


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


# ---------------------------------------------------------------- what hosts say is printed as written


def test_host_answers_with_brackets_are_printed_as_written(monkeypatch):
    from netbench import remote_cli

    removed = ["tbf qdisc [/] on eth1", "process [bold]1234[/bold]"]
    hosts = [FakeHost("a", [(" reset ", ok_json({"removed": removed}))]),
             FakeHost("b", [(" reset ", ok_json({"removed": []}))])]
    monkeypatch.setattr(remote_cli, "_open", lambda path, insecure: (INV, hosts))
    result = CliRunner().invoke(main, ["reset", "--inventory", "inv.yaml"])
    assert result.exit_code == 0, result.output
    assert "a: removed tbf qdisc [/] on eth1" in result.stdout
    assert "a: removed process [bold]1234[/bold]" in result.stdout


def test_host_show_with_brackets_is_printed_as_written(monkeypatch):
    from netbench import remote_cli

    row = {"node": "a", "backend": "netem", "qdisc": {"drops": 0}, "engine": None,
           "profile": {"name": "x", "delay": "[/]", "peers": ["[red]n2"]}}
    shown = {"host": "a", "interface": "eth1", "nodes": [row], "lease": {"held": False}, "watchers": [], "pending": []}
    hosts = [FakeHost("a", [(" show ", ok_json(shown))]), FakeHost("b", [(" show ", ok_json(shown))])]
    monkeypatch.setattr(remote_cli, "_open", lambda path, insecure: (INV, hosts))
    result = CliRunner().invoke(main, ["show", "--inventory", "inv.yaml"], terminal_width=300)
    assert result.exit_code == 0, result.output
    assert "[/]" in result.stdout and "[red]n2" in result.stdout
