"""Inventory loading and validation (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from netbench.remote.inventory import InventoryError, inventory_from_mapping, load_inventory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "playbooks" / "inventory" / "example.yaml"


def test_shipped_example_loads_with_defaults_merged():
    inv = load_inventory(EXAMPLE)
    gpu1, gpu2 = inv.hosts
    assert (gpu1.name, gpu1.ssh, gpu1.interface, gpu1.user, gpu1.port) == ("gpu1", "gpu1", "eth1", "root", None)
    assert gpu1.roles == ("chief", "worker") and gpu1.venv == "/opt/netbench/venv"
    assert (gpu2.interface, gpu2.port, gpu2.user, gpu2.sudo) == ("ens5", 2222, "ubuntu", True)
    assert gpu2.key == str(Path("~/.ssh/id_ed25519").expanduser())
    assert gpu2.netbench == "/opt/netbench/venv/bin/netbench"
    assert gpu2.lease_path == "/run/netbench/lease.json"


def test_relative_paths_resolve_against_the_inventory_folder(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("known_hosts: kh\nhosts:\n  a: {ssh: 10.0.0.1, interface: eth1, key: keys/id}\n")
    inv = load_inventory(path)
    assert inv.known_hosts == (str(tmp_path / "kh"),)
    assert inv.hosts[0].key == str(tmp_path / "keys" / "id")
    assert inv.hosts[0].user is None and inv.hosts[0].port is None  # left to ~/.ssh/config


@pytest.mark.parametrize("data, message", [
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1", "prot": 22}}}, "src.yaml: hosts.a.prot: unknown key"),
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1", "port": 70000}}}, "src.yaml: hosts.a.port: must be a port"),
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1", "port": True}}}, "src.yaml: hosts.a.port: must be a port"),
    ({"hosts": {"a": {"ssh": "x"}}}, "src.yaml: hosts.a.interface: missing (required)"),
    ({"hosts": {"a": {"interface": "eth1"}}}, "src.yaml: hosts.a.ssh: missing (required)"),
    ({"hosts": {"a": {"ssh": "x", "interface": "a-very-long-interface"}}}, "src.yaml: hosts.a.interface: not an interface"),
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1", "roles": ["boss"]}}}, "src.yaml: hosts.a.roles: must be a list"),
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1", "tf_address": "10.0.0.300"}}}, "src.yaml: hosts.a.tf_address"),
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1", "venv": "rel/venv"}}}, "src.yaml: hosts.a.venv: must be an absolute"),
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1", "sudo": "yes"}}}, "src.yaml: hosts.a.sudo: must be true or false"),
    ({"hosts": {}}, "src.yaml: hosts: must map at least one host"),
    ({"hosts": {"a": {"ssh": "-oProxyCommand=touch /tmp/x", "interface": "eth1"}}},
     "src.yaml: hosts.a.ssh: must not begin with '-'"),
    ({"hosts": {"a": {"ssh": "  -x", "interface": "eth1"}}}, "src.yaml: hosts.a.ssh: must not begin with '-'"),
    ({"hosts": {"a": {"ssh": "x y", "interface": "eth1"}}}, "src.yaml: hosts.a.ssh: must not begin with '-' nor hold"),
    ({"hosts": {"a": {"ssh": "x", "user": "-l", "interface": "eth1"}}}, "src.yaml: hosts.a.user: must not begin"),
    ({"defaults": {"user": "-froot"}, "hosts": {"a": {"ssh": "x", "interface": "eth1"}}},
     "src.yaml: defaults.user: must not begin"),
    ({"hosts": {"a": {"ssh": "x", "interface": "eth1"}}, "extra": 1}, "src.yaml: extra: unknown key"),
    ({"defaults": {"ssh": "x"}, "hosts": {"a": {"interface": "eth1"}}}, "src.yaml: defaults.ssh:"),
    ({"hosts": {"a b": {"ssh": "x", "interface": "eth1"}}}, "src.yaml: hosts.a b: a host name"),
    (["not", "a", "mapping"], "src.yaml: an inventory must be a mapping"),
])
def test_bad_inventories_name_the_file_and_key(data, message):
    with pytest.raises(InventoryError) as info:
        inventory_from_mapping(data, "src.yaml")
    assert info.value.message.startswith(message), info.value.message
    assert "\n" not in info.value.message


def test_broken_yaml_and_missing_file(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("hosts:\n  a: {ssh: x\n")
    with pytest.raises(InventoryError, match=r"broken.yaml: broken YAML at line \d"):
        load_inventory(broken)
    with pytest.raises(InventoryError, match="no such inventory file"):
        load_inventory(tmp_path / "absent.yaml")


def test_cli_reports_a_bad_inventory_in_one_line(tmp_path):
    from click.testing import CliRunner

    from netbench.cli.app import main

    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a: {ssh: x, interface: eth1, port: zero}\n")
    result = CliRunner().invoke(main, ["reset", "--inventory", str(path)])
    assert result.exit_code == 2
    assert f"{path}: hosts.a.port: must be a port number" in result.output


def test_ssh_config_beats_inventory_defaults_but_not_a_hosts_own_keys():
    from netbench.remote.ssh import ssh_settings

    inv = inventory_from_mapping({"defaults": {"interface": "eth1", "user": "root", "port": 2200, "key": "/k/default"},
                                  "hosts": {"alias": {"ssh": "alias"},
                                            "own": {"ssh": "own", "user": "ubuntu", "port": 22, "key": "/k/own"}}},
                                 "inv.yaml")
    alias, own = inv.hosts
    assert alias.defaulted == ("interface", "key", "port", "user") and own.defaulted == ("interface",)
    configured = {"hostname": "10.0.0.1", "user": "admin", "port": "2222", "identityfile": ["/k/cfg"]}
    assert ssh_settings(alias, configured) == (None, None, None)  # ~/.ssh/config decides
    assert ssh_settings(alias, {"hostname": "alias"}) == ("root", 2200, "/k/default")  # nothing there: defaults
    assert ssh_settings(own, configured) == ("ubuntu", 22, "/k/own")  # the host's own keys always win


@pytest.mark.parametrize("name", ["gpu1\n", "a\n"])
def test_a_host_name_with_a_trailing_newline_is_refused(name):
    # '$' matches before a final newline: 'gpu1\n' passed and became part of log file names
    with pytest.raises(InventoryError, match=r"src.yaml: hosts\.'.*\\n': a host name is letters") as info:
        inventory_from_mapping({"hosts": {name: {"ssh": "x", "interface": "eth1"}}}, "src.yaml")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("address", ["fd00::1", "::1", "2001:db8::2"])
def test_an_ipv6_tf_address_is_refused(address):
    # TF_CONFIG was written as 'fd00::1:PORT' (no brackets) and peer filters are IPv4 (/32)
    with pytest.raises(InventoryError, match=r"src.yaml: hosts\.a\.tf_address: IPv6 is not supported") as info:
        inventory_from_mapping({"hosts": {"a": {"ssh": "x", "interface": "eth1", "tf_address": address}}}, "src.yaml")
    assert "IPv4" in info.value.hint


@pytest.mark.parametrize("address", ["10.0.0.1 ", "192.0.2.12"])
def test_an_ipv4_tf_address_is_taken(address):
    inv = inventory_from_mapping({"hosts": {"a": {"ssh": "x", "interface": "eth1", "tf_address": address}}}, "s")
    assert inv.hosts[0].tf_address == address.strip()
