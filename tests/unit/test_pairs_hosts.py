"""A per-pair topology over an inventory's hosts without SSH: ShapePairs over the wire, each
host's row planned toward the other hosts' tf_address, the refusals (unknown nodes, no
tf_address, no netem), `apply --topology --inventory` and its read-back with `show --inventory`,
against FakeHost (tests/fakes/remote.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from tests.fakes.remote import FakeHost, ok_json

from netbench.cli.app import main
from netbench.emulation import changes as ch
from netbench.emulation import wire
from netbench.errors import BackendUnavailable, ProfileError, UsageError
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import profile_from_mapping
from netbench.remote import controller as remote
from netbench.remote.agent import HOST_NETNS
from netbench.remote.inventory import inventory_from_mapping
from netbench.remote.pairs import hosts_pairs, plan_pairs_for_host
from netbench.testbed.hosts import HostsTestbed

INV = inventory_from_mapping({
    "defaults": {"interface": "eth1", "venv": "/opt/nb"},
    "hosts": {"h1": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1"},
              "h2": {"ssh": "10.0.0.2", "tf_address": "10.9.0.2"},
              "h3": {"ssh": "10.0.0.3", "tf_address": "10.9.0.3"}}}, "inv.yaml")
NEAR = profile_from_mapping({"delay": "2ms"}, "test")
FAR = profile_from_mapping({"delay": "25ms", "rate": "100mbit",
                            "loss": {"model": "gilbert-elliott", "p": "1%", "r": "30%"}}, "test")
TOPOLOGY = """name: three
groups:
  us: [h1, h2]
  eu: [h3]
links:
  us: {delay: 2ms}
  us-eu: {delay: 25ms, rate: 100mbit}
"""


def three(names=("h1", "h2", "h3")):
    """h1, h2 near each other; h3 far from both (both directions)."""
    near = {("h1", "h2"), ("h2", "h1")}
    links = tuple(PairLink(s, d, NEAR if (s, d) in near else FAR) for s in names for d in names if s != d)
    return PairTopology("three", tuple(names), links, source="three.yaml")


def info(backend="netem"):
    return ok_json({"backend": backend, "backend_reason": "probe", "interface_ok": True,
                    "interfaces": {"eth1": []}, "netbench": "0.1.0"})


def fake_hosts(backends=("netem", "netem", "netem"), extra=()):
    return [FakeHost(name, [(" info ", info(backend)), (" apply ", ok_json({"applied": []})), *extra])
            for name, backend in zip(("h1", "h2", "h3"), backends)]


# ---------------------------------------------------------------- the wire

def test_shape_pairs_round_trips_through_json_with_its_classes_and_their_netem():
    plan = plan_pairs_for_host(three(), INV.host("h1"), "netem", remote.hosts_topology(INV))
    text = wire.plan_to_json(plan)
    back = wire.plan_from_json(text)
    assert back == plan
    shaped = next(c for c in back if isinstance(c, ch.ShapePairs))
    assert all(isinstance(c, ch.PairClass) and isinstance(c.netem, type(plan[0].classes[0].netem))
               for c in shaped.classes)
    assert shaped.classes[1].netem.ge == (0.01, 0.3, 1.0, 0.0) and isinstance(shaped.classes[1].netem.ge, tuple)
    assert back[0].describe() == plan[0].describe()


@pytest.mark.parametrize("classes, message", [
    ([{"peer": "10.9.0.2/32", "netem": {"delay_us": 1}, "rate_bps": None, "cmd": "x"}],
     "plan: ShapePairs.classes[0]: unknown field(s) cmd"),
    ([{"peer": "10.9.0.2/32", "netem": {"delay_us": 1, "rm": 1}}], "plan: ShapePairs.classes[0].netem: unknown field(s) rm"),
    (["10.9.0.2/32"], "plan: ShapePairs.classes[0]: must be an object"),
    ([{"peer": "10.9.0.2/32", "netem": 5}], "plan: ShapePairs.classes[0].netem: must be an object"),
    ([{"netem": {}}], "plan: ShapePairs.classes[0]: "),
])
def test_a_bad_shape_pairs_is_refused_naming_the_class(classes, message):
    text = json.dumps({"version": 1, "changes": [{"type": "ShapePairs", "node": "h1", "netns": "@host",
                                                  "dev": "eth1", "classes": classes}]})
    with pytest.raises(UsageError) as info_:
        wire.plan_from_json(text)
    assert info_.value.message.startswith(message), info_.value.message


# ---------------------------------------------------------------- each host's row

def test_each_host_shapes_its_egress_toward_the_other_hosts_tf_address_as_its_row_says():
    planned = remote.plan_hosts(INV, {h.name: {"backend": "netem"} for h in INV.hosts}, three(), None)
    assert planned.backends == {"h1": "netem", "h2": "netem", "h3": "netem"}
    for host in INV.hosts:
        plan = planned.plans[host.name]
        assert [type(c).__name__ for c in plan] == ["ShapePairs", "ClearIngress"]
        shaped = plan[0]
        assert (shaped.node, shaped.netns, shaped.dev) == (host.name, HOST_NETNS, "eth1")
        others = [h for h in INV.hosts if h.name != host.name]
        assert [c.peer for c in shaped.classes] == [f"{h.tf_address}/32" for h in others]
    h1 = planned.plans["h1"][0].classes
    assert (h1[0].netem.delay_us, h1[0].rate_bps) == (2_000, None)  # to h2: near
    assert (h1[1].netem.delay_us, h1[1].rate_bps, h1[1].netem.ge) == (25_000, 100_000_000, (0.01, 0.3, 1.0, 0.0))  # to h3: far
    h3 = planned.plans["h3"][0].classes
    assert [c.netem.delay_us for c in h3] == [25_000, 25_000]


def test_a_host_the_topology_leaves_out_is_cleared():
    pairs = PairTopology("two", ("h1", "h2"), (PairLink("h1", "h2", NEAR), PairLink("h2", "h1", NEAR)))
    planned = remote.plan_hosts(INV, {h.name: {"backend": "netem"} for h in INV.hosts}, pairs, None)
    assert [type(c).__name__ for c in planned.plans["h3"]] == ["ClearQdisc", "ClearIngress"]
    assert [c.peer for c in planned.plans["h1"][0].classes] == ["10.9.0.2/32"]


def test_a_node_not_in_the_inventory_is_refused_naming_file_and_key_before_any_host_is_asked():
    pairs = three(("h1", "h2", "h9"))
    hosts = fake_hosts()
    with pytest.raises(ProfileError) as info_:
        remote.plan_inventory(INV, hosts, pairs, None)
    assert info_.value.message.startswith("three.yaml: matrix: h9: no node h9 in the inventory inv.yaml (h1, h2, h3)")
    assert not any(host.ran("") for host in hosts)


def test_a_shaped_host_without_tf_address_is_refused_naming_it():
    inv = inventory_from_mapping({"defaults": {"interface": "eth1"},
                                  "hosts": {"h1": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1"},
                                            "h2": {"ssh": "10.0.0.2"}}}, "inv.yaml")
    with pytest.raises(UsageError, match=r"^inv.yaml: hosts.h2.tf_address: missing; the topology three.yaml"):
        remote.plan_hosts(inv, {"h1": {"backend": "netem"}, "h2": {"backend": "netem"}}, three(("h1", "h2")), None)


@pytest.mark.parametrize("backend", ["userspace", "rateonly"])
def test_a_host_without_netem_is_refused_naming_it(backend):
    with pytest.raises(BackendUnavailable) as info_:
        remote.plan_hosts(INV, {"h1": {"backend": "netem"}, "h2": {"backend": backend}, "h3": {"backend": "netem"}},
                          three(), None)
    assert info_.value.message.startswith("host h2: a topology needs the netem backend there")
    assert "\n" not in info_.value.message


def test_hosts_testbed_plans_a_topology_without_asking_when_the_backend_is_given():
    hosts = fake_hosts()
    planned = HostsTestbed(INV, hosts).plan(three(), "netem", probe=False)
    assert not planned.probed and not any(host.ran("") for host in hosts)
    assert [c.peer for c in planned.changes["h2"][0].classes] == ["10.9.0.1/32", "10.9.0.3/32"]
    with pytest.raises(ProfileError, match="no node h9 in the inventory inv.yaml"):
        HostsTestbed(INV, hosts).plan(three(("h1", "h9")), "netem", probe=False)


# ---------------------------------------------------------------- read back

def test_hosts_read_back_as_the_topology_they_hold():
    planned = remote.plan_hosts(INV, {h.name: {"backend": "netem"} for h in INV.hosts}, three(), None)
    shown = {}
    for host in INV.hosts:
        shaped = planned.plans[host.name][0]
        tree = {"kind": "htb", "pairs": [{"peer": c.peer, "netem": {"delay_us": c.netem.delay_us,
                                                                    "loss": c.netem.loss}, "rate_bps": c.rate_bps}
                                         for c in shaped.classes]}
        shown[host.name] = {"nodes": [{"node": f"machine-{host.name}", "qdisc": tree, "engine": None}]}
    held = hosts_pairs(shown, remote.hosts_topology(INV))
    assert held.nodes == ("h1", "h2", "h3")
    assert {(link.src, link.dst): link.profile.delay_us for link in held.links} == {
        ("h1", "h2"): 2_000, ("h1", "h3"): 25_000, ("h2", "h1"): 2_000, ("h2", "h3"): 25_000,
        ("h3", "h1"): 25_000, ("h3", "h2"): 25_000}
    assert held.link("h3", "h1").rate_bps == 100_000_000
    assert hosts_pairs({"h1": {"nodes": [{"node": "x", "qdisc": {"kind": "tbf"}}]}}, remote.hosts_topology(INV)) is None


# ---------------------------------------------------------------- the command line

def _cli(monkeypatch, tmp_path, hosts, *args):
    monkeypatch.setattr(remote, "open_inventory", lambda path, insecure: (INV, hosts))
    topology = tmp_path / "three.yaml"
    topology.write_text(TOPOLOGY)
    return CliRunner().invoke(main, ["apply", "--topology", str(topology), "--inventory", "inv.yaml", *args],
                              terminal_width=300)


def test_apply_topology_inventory_dry_run_prints_each_hosts_changes_and_changes_nothing(monkeypatch, tmp_path):
    hosts = fake_hosts()
    result = _cli(monkeypatch, tmp_path, hosts, "--dry-run", "--backend", "netem")
    assert result.exit_code == 0, result.output
    assert not any(host.ran("") for host in hosts)
    for name in ("h1", "h2", "h3"):
        assert f"host {name} (eth1): backend netem" in result.output
    assert "h1: tc filter replace dev eth1 parent 4e42: protocol ip prio 1 u32 ht" in result.output
    assert "match ip dst 10.9.0.3/32" in result.output and "delay 25ms" in result.output
    assert "no host was changed" in result.output


def test_apply_topology_inventory_sends_each_host_its_row(monkeypatch, tmp_path):
    hosts = fake_hosts()
    result = _cli(monkeypatch, tmp_path, hosts, "--lease", "0", "--scale", "2")
    assert result.exit_code == 0, result.output
    assert "applied topology three (6 shaped pair(s)) to 3 host(s)" in result.output
    for host in hosts:
        (command, plan_json), = host.ran(" apply ")
        assert " apply --json --lease 0 " in command
        shaped, clear = wire.plan_from_json(plan_json)
        assert isinstance(shaped, ch.ShapePairs) and isinstance(clear, ch.ClearIngress)
        assert all(f"{host.name[-1]}/32" not in c.peer for c in shaped.classes)
    h1 = wire.plan_from_json(hosts[0].ran(" apply ")[0][1])[0]
    assert [(c.peer, c.netem.delay_us) for c in h1.classes] == [("10.9.0.2/32", 4_000), ("10.9.0.3/32", 50_000)]


def test_apply_topology_inventory_refuses_a_host_without_netem_and_applies_nothing(monkeypatch, tmp_path):
    hosts = fake_hosts(backends=("netem", "userspace", "netem"))
    result = _cli(monkeypatch, tmp_path, hosts, "--lease", "0")
    assert result.exit_code != 0
    assert "host h2: a topology needs the netem backend there" in result.output
    assert not any(host.ran(" apply ") for host in hosts)


def test_apply_topology_inventory_refuses_a_group_of_unknown_hosts_before_any_connection(monkeypatch, tmp_path):
    hosts = fake_hosts()
    monkeypatch.setattr(remote, "open_inventory", lambda path, insecure: (INV, hosts))
    topology = tmp_path / "bad.yaml"
    topology.write_text(TOPOLOGY.replace("eu: [h3]", "eu: [h7]"))
    result = CliRunner().invoke(main, ["apply", "--topology", str(topology), "--inventory", "inv.yaml"])
    assert result.exit_code == 2, result.output
    assert f"{topology}: groups: eu: no node h7 in the inventory inv.yaml" in result.output
    assert not any(host.ran("") for host in hosts)


def test_show_inventory_reads_back_the_per_pair_matrix(monkeypatch):
    planned = remote.plan_hosts(INV, {h.name: {"backend": "netem"} for h in INV.hosts}, three(), None)
    hosts = []
    for host in INV.hosts:
        tree = {"kind": "htb", "pairs": [{"peer": c.peer, "netem": {"delay_us": c.netem.delay_us},
                                          "rate_bps": c.rate_bps} for c in planned.plans[host.name][0].classes]}
        row = {"node": "machine", "backend": "netem", "qdisc": tree, "engine": None, "profile": None}
        hosts.append(FakeHost(host.name, [(" show ", ok_json({"host": "machine", "interface": "eth1", "nodes": [row],
                                                              "lease": {"held": False}, "watchers": []}))]))
    monkeypatch.setattr(remote, "open_inventory", lambda path, insecure: (INV, hosts))
    result = CliRunner().invoke(main, ["show", "--inventory", "inv.yaml", "--json"])
    assert result.exit_code == 0, result.output
    pairs = json.loads(result.stdout)["pairs"]
    assert {(p["src"], p["dst"]): p["profile"]["delay_us"] for p in pairs["links"]} == {
        ("h1", "h2"): 2_000, ("h1", "h3"): 25_000, ("h2", "h1"): 2_000, ("h2", "h3"): 25_000,
        ("h3", "h1"): 25_000, ("h3", "h2"): 25_000}


def test_a_hosts_per_destination_tree_goes_over_json_and_reads_back_exactly():
    """node show sends each destination's netem leaf (NetemParams) as a JSON object; the
    controller reads it back to the profile planned (loss model included)."""
    from netbench.remote.agent import _plain_pairs

    shaped = remote.plan_hosts(INV, {h.name: {"backend": "netem"} for h in INV.hosts}, three(), None).plans["h1"][0]
    tree = {"kind": "htb", "netem": None, "pairs": [{"peer": c.peer, "netem": c.netem, "rate_bps": c.rate_bps,
                                                     "classid": f"4e42:{i + 1}", "drops": 0}
                                                    for i, c in enumerate(shaped.classes)]}
    row = {"node": "machine", "qdisc": tree, "engine": None, "profile": None}
    sent = json.loads(json.dumps({"nodes": [_plain_pairs(row)]}, default=str))
    held = hosts_pairs({"h1": sent}, remote.hosts_topology(INV))
    assert held.link("h1", "h2").delay_us == NEAR.delay_us
    far = held.link("h1", "h3")
    assert (far.delay_us, far.rate_bps, far.loss_model, far.ge_p, far.ge_r) == (25_000, 100_000_000,
                                                                                 "gilbert-elliott", 0.01, 0.3)
    sent["nodes"][0]["qdisc"]["pairs"][0]["netem"]["rm"] = 1
    with pytest.raises(UsageError, match=r"^host h1: qdisc.pairs\[0\].netem: unknown field\(s\) rm"):
        hosts_pairs({"h1": sent}, remote.hosts_topology(INV))
