"""The one Target protocol (testbed/base.py): both targets serve every command, and
testbed.targets.open_target chooses between them from --inventory alone."""

from __future__ import annotations

import inspect

import pytest
from click.testing import CliRunner
from tests.fakes.remote import FakeHost, ok_json

from netbench.cli import common
from netbench.cli.app import main
from netbench.errors import PrivilegeError, UsageError
from netbench.model.profile import load_profile
from netbench.remote import controller
from netbench.remote.inventory import inventory_from_mapping
from netbench.testbed import base
from netbench.testbed.embedded import EmbeddedTestbed
from netbench.testbed.hosts import HostsTestbed
from netbench.testbed.targets import open_target

INV = inventory_from_mapping({
    "defaults": {"interface": "eth1", "venv": "/opt/nb"},
    "hosts": {"a": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1"},
              "b": {"ssh": "10.0.0.2", "tf_address": "10.9.0.2"}}}, "inv.yaml")

TARGET_METHODS = sorted(name for name, _ in inspect.getmembers(base.Target, inspect.isfunction)
                        if not name.startswith("_"))


def test_the_protocol_names_every_command_and_what_sweeps_need():
    assert TARGET_METHODS == ["apply", "apply_plan", "doctor", "finish", "nodes_for", "plan", "prepare", "reset",
                              "show", "start", "verify"]


@pytest.mark.parametrize("cls", [EmbeddedTestbed, HostsTestbed])
def test_both_targets_implement_every_method(cls):
    missing = [name for name in TARGET_METHODS if not callable(getattr(cls, name, None))]
    assert missing == []


def test_open_target_without_inventory_is_the_embedded_testbed(tmp_path):
    with open_target(None, journal=None) as target:
        assert isinstance(target, EmbeddedTestbed) and target.kind == "embedded"


def test_open_target_with_inventory_is_its_hosts_and_closes_them(monkeypatch):
    hosts = [FakeHost("a"), FakeHost("b")]
    monkeypatch.setattr(controller, "open_inventory", lambda path, insecure: (INV, hosts))
    with open_target("inv.yaml", takeover=True) as target:
        assert isinstance(target, HostsTestbed) and target.kind == "hosts" and target.takeover
        assert [h.closed for h in hosts] == [False, False]
    assert [h.closed for h in hosts] == [True, True]


def test_exit_statuses_match_the_error_tree():
    assert common.ExitStatus.USAGE == UsageError.exit_code
    assert common.ExitStatus.PRIVILEGE == PrivilegeError.exit_code


def _shown(profile):
    row = {"node": "x", "backend": "netem", "qdisc": {"drops": 0}, "engine": None, "profile": profile}
    return {"host": "x", "interface": "eth1", "nodes": [row], "lease": {"held": False}, "watchers": [],
            "pending": []}


def test_show_output_over_hosts_writes_their_common_profile(monkeypatch, tmp_path):
    profile = {"name": "active", "delay": "10ms", "jitter": "0us", "loss": "1%", "rate": "100mbit"}
    hosts = [FakeHost(name, [(" show ", ok_json(_shown(profile)))]) for name in ("a", "b")]
    monkeypatch.setattr(controller, "open_inventory", lambda path, insecure: (INV, hosts))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["show", "--inventory", "inv.yaml", "--output", "p.yaml"], terminal_width=300)
    assert result.exit_code == 0, result.output
    written = load_profile(tmp_path / "p.yaml")
    assert (written.delay_us, written.loss, written.rate_bps) == (10_000, 0.01, 100_000_000)


def test_show_output_over_hosts_refuses_different_profiles(monkeypatch, tmp_path):
    profile = {"name": "active", "delay": "10ms", "jitter": "0us", "loss": "0%"}
    hosts = [FakeHost("a", [(" show ", ok_json(_shown(profile)))]),
             FakeHost("b", [(" show ", ok_json(_shown(None)))])]
    monkeypatch.setattr(controller, "open_inventory", lambda path, insecure: (INV, hosts))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["show", "--inventory", "inv.yaml", "--output", "p.yaml"], terminal_width=300)
    assert result.exit_code == 2
    assert "the nodes hold different profiles (a: 10ms" in result.output and "b: none" in result.output
    assert not (tmp_path / "p.yaml").exists()
