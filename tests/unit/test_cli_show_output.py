"""`netbench show --output FILE` writes a profile that `netbench apply FILE` takes back
(tcconfig's round trip). Pure: the embedded Target runs on the fake kernel adapters."""

from __future__ import annotations

import contextlib
import ipaddress

import pytest
from click.testing import CliRunner
from tests.fakes.netlink import make_fakes

from netbench.cli import common, emulation
from netbench.cli.app import main
from netbench.emulation import backends
from netbench.errors import UsageError
from netbench.model.profile import Profile, load_profile
from netbench.model.topology import plan_topology
from netbench.state.journal import Journal
from netbench.testbed.base import EMBEDDED, Planned, common_profile
from netbench.testbed.embedded import EmbeddedTestbed

TOPO = plan_topology(3, ipaddress.ip_network("10.214.0.0/24"))

RICH = """\
name: wan
delay: 20ms
jitter: 5ms
jitter_correlation: 50%
distribution: pareto
loss: 1%
duplicate: 0.1%
reorder: 25%
reorder_gap: 3
rate: 100mbit
limit: 500
"""


@pytest.fixture
def target(monkeypatch, tmp_path):
    """One embedded Target on fakes, the one every command of the test opens."""
    qdiscs, iptables, engines, _ = make_fakes()
    testbed = EmbeddedTestbed(Journal(tmp_path / "state"), adapters=(qdiscs, iptables, engines),
                              discover=lambda: TOPO, probe=lambda: (True, "sch_netem (fake)"))

    @contextlib.contextmanager
    def open_target(inventory=None, insecure_host_keys=False, **kwargs):
        assert inventory is None
        yield testbed

    monkeypatch.setattr(emulation, "open_target", open_target)
    monkeypatch.setattr(common, "require_root", lambda: None)
    monkeypatch.setattr(common, "require_testbed", lambda *a: None)
    monkeypatch.chdir(tmp_path)
    return testbed


def invoke(*args):
    return CliRunner().invoke(main, list(args), terminal_width=300)


def describe(profile: Profile) -> list[str]:
    return [change.describe() for change in backends.plan_apply(profile, TOPO, "netem")]


def test_show_output_writes_a_profile_apply_takes_back_to_the_same_plan(target, tmp_path):
    (tmp_path / "wan.yaml").write_text(RICH)
    assert invoke("apply", "wan.yaml").exit_code == 0
    first = invoke("show", "--output", "active.yaml")
    assert first.exit_code == 0, first.output
    assert "wrote profile" in first.output and "netbench apply active.yaml" in first.output
    written = load_profile(tmp_path / "active.yaml")
    assert describe(written) == describe(load_profile(tmp_path / "wan.yaml"))

    before = [row["profile"] for row in target.show()["nodes"]]
    result = invoke("apply", "active.yaml")
    assert result.exit_code == 0, result.output
    assert [row["profile"] for row in target.show()["nodes"]] == before  # the same profile is read back
    assert invoke("show", "--output", "again.yaml").exit_code == 0
    assert (tmp_path / "again.yaml").read_text() == (tmp_path / "active.yaml").read_text()


def test_show_output_with_json_keeps_stdout_json(target, tmp_path):
    import json

    assert invoke("apply", "--latency", "10ms", "--bandwidth", "50mbit").exit_code == 0
    result = invoke("show", "--json", "--output", "active.yaml")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["nodes"]) == 3
    assert load_profile(tmp_path / "active.yaml").delay_us == 10_000


def test_show_output_refuses_nodes_with_different_profiles(target, tmp_path):
    profile = Profile(name="one", delay_us=10_000)
    changes = backends.plan_apply(profile, TOPO, "netem")
    only_first = tuple(c for c in changes if getattr(c, "netns", None) in (None, TOPO.nodes[0].netns))
    target.apply_plan(Planned(profile=profile, backends={EMBEDDED: "netem"}, changes={EMBEDDED: only_first}))
    result = invoke("show", "--output", "active.yaml")
    assert result.exit_code == 2
    assert "the nodes hold different profiles" in result.output and "n2: none" in result.output
    assert not (tmp_path / "active.yaml").exists()


def test_show_output_refuses_when_nothing_is_shaped(target, tmp_path):
    result = invoke("show", "--output", "active.yaml")
    assert result.exit_code == 2 and "nothing to write: no node is shaped" in result.output
    assert not (tmp_path / "active.yaml").exists()


def test_common_profile_over_hosts():
    row = {"profile": {"name": "active", "delay": "10ms", "jitter": "0us", "loss": "0%"}}
    same = {"hosts": {"a": {"nodes": [dict(row, node="a")]}, "b": {"nodes": [dict(row, node="b")]}}}
    assert common_profile(same) == row["profile"]
    differ = {"hosts": {"a": {"nodes": [dict(row, node="a")]}, "b": {"nodes": [{"node": "b", "profile": None}]}}}
    with pytest.raises(UsageError, match="a: 10ms.*b: none"):
        common_profile(differ)
    with pytest.raises(UsageError, match="no testbed is up"):
        common_profile({"nodes": []})
