"""`netbench apply --schedule --inventory` against FakeHosts: each change goes to every host
through its agent, in parallel, over the connections opened once; Ctrl-C puts every host back."""

from __future__ import annotations

import threading

import pytest
from click.testing import CliRunner
from tests.fakes.remote import FakeHost, ok_json

from netbench import units
from netbench.cli import common
from netbench.cli.app import main
from netbench.emulation import changes as ch
from netbench.emulation import wire
from netbench.experiment import schedule as runner
from netbench.remote import controller as remote
from netbench.remote.inventory import inventory_from_mapping
from netbench.remote.ssh import CommandResult

INV = inventory_from_mapping({
    "defaults": {"interface": "eth1", "venv": "/opt/nb"},
    "hosts": {"a": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1"},
              "b": {"ssh": "10.0.0.2", "tf_address": "10.9.0.2"}}}, "inv.yaml")
THREE = ("name: three\nsteps:\n  - {at: 0s, rate: 10mbit}\n  - {at: 10ms, rate: 20mbit}\n"
         "  - {at: 20ms, rate: 30mbit}\n")


class Agent:
    """A host's `netbench node` over FakeHost: rate-only (tbf), remembers what it holds."""

    def __init__(self, name: str, barrier: threading.Barrier | None = None) -> None:
        self.name = name
        self.rate: int | None = None
        self.applies: list[tuple[str, list]] = []  # (command, plan)
        self.barrier = barrier
        self.host = FakeHost(name, [(" info ", ok_json({"interfaces": {"eth1": ["10.9.0.1/24"]}, "interface_ok": True,
                                                        "backend": "userspace", "backend_reason": "no sch_netem"})),
                                    (" apply ", self.apply), (" show ", self.show),
                                    ("netbench.state.lease renew", CommandResult(0, "", ""))])

    def apply(self, command: str, input: str | None) -> CommandResult:
        plan = wire.plan_from_json(input)
        if self.barrier is not None:
            self.barrier.wait()  # every host's change is in flight at once, or this breaks
        self.applies.append((command, plan))
        tbfs = [c for c in plan if isinstance(c, ch.SetTbf)]
        self.rate = tbfs[-1].rate_bps if tbfs else None
        return ok_json({"applied": [c.describe() for c in plan]})

    def show(self, command: str, input: str | None) -> CommandResult:
        profile = {"name": "read-back", "rate": units.format_rate_bps(self.rate)} if self.rate else None
        row = {"node": self.name, "backend": "userspace" if self.rate else None, "qdisc": None, "engine": None,
               "profile": profile}
        return ok_json({"host": self.name, "interface": "eth1", "nodes": [row], "lease": {"held": False},
                        "watchers": [], "pending": []})


@pytest.fixture
def agents(monkeypatch, tmp_path):
    barrier = threading.Barrier(2, timeout=10)
    made = [Agent("a", barrier), Agent("b", barrier)]
    opened = []
    monkeypatch.setattr(remote, "open_inventory",
                        lambda path, insecure: opened.append(str(path)) or (INV, [agent.host for agent in made]))
    monkeypatch.setattr(common, "sigterm_as_interrupt", lambda: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "three.yaml").write_text(THREE)
    (tmp_path / "inv.yaml").write_text("")
    made[0].opened = opened
    return made


def invoke(*args):
    return CliRunner().invoke(main, ["apply", "--schedule", "three.yaml", "--inventory", "inv.yaml", *args],
                              terminal_width=300)


def test_each_change_goes_to_every_host_and_the_last_step_stays(agents):
    result = invoke()
    assert result.exit_code == 0, result.output
    for rate in ("10", "20", "30"):
        assert f"(0ms/{rate}mbit/0%)  landed" in result.output, result.output
    assert "schedule: 3 change(s), lateness mean" in result.output
    assert "each change: one SSH round trip to 2 host(s) in parallel, mean" in result.output
    assert agents[0].opened == ["inv.yaml"]  # the connections were opened once, for the whole schedule
    for agent in agents:
        rates = [next(c.rate_bps for c in plan if isinstance(c, ch.SetTbf)) for _, plan in agent.applies]
        assert rates == [10_000_000, 20_000_000, 30_000_000, 30_000_000]  # the last again, releasing the lease
        assert all("--lease 60" in command for command, _ in agent.applies[:3])
        assert "--lease 0" in agent.applies[-1][0] and agent.rate == 30_000_000
        holders = {command.split("--holder ")[1].split()[0] for command, _ in agent.applies}
        assert len(holders) == 1  # one controller session holds every change
        assert agent.host.closed
    shown = CliRunner().invoke(main, ["show", "--inventory", "inv.yaml", "--json"])
    assert shown.output.count(f'"rate": "{units.format_rate_bps(30_000_000)}"') == 2, shown.output


def test_ctrl_c_puts_every_host_back_as_before(agents, monkeypatch):
    real = runner.run_schedule

    def interrupted(timeline, apply, **kwargs):
        real(timeline[:2], apply, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_schedule", interrupted)
    result = invoke()
    assert result.exit_code == 130, result.output
    assert "restored the link as it was: none" in result.output and "schedule: 2 change(s)" in result.output
    for agent in agents:
        assert agent.rate is None and "--lease 0" in agent.applies[-1][0]
        assert not any(isinstance(c, ch.SetTbf) for c in agent.applies[-1][1])


def test_a_delay_step_is_refused_for_a_rate_only_host_before_any_change(agents, tmp_path):
    (tmp_path / "three.yaml").write_text(THREE + "  - {at: 30ms, delay: 5ms}\n")
    result = invoke()
    assert result.exit_code != 0 and "without netem a remote host shapes rate only" in result.output
    assert all(agent.applies == [] for agent in agents)


def test_dry_run_changes_no_host(agents):
    agents[0].barrier = agents[1].barrier = None
    result = invoke("--dry-run")
    assert result.exit_code == 0, result.output
    assert "no host was changed" in result.output and all(agent.applies == [] for agent in agents)


def test_without_inventory_the_remote_flags_are_still_refused(agents):
    result = CliRunner().invoke(main, ["apply", "--schedule", "three.yaml", "--lease", "5"])
    assert result.exit_code == 2 and "flag --lease: only with --inventory" in result.output
