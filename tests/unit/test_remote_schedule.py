"""`netbench apply --schedule --inventory` against FakeHosts: each change goes to every host
through its agent, in parallel, over the connections opened once; Ctrl-C puts every host back."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner
from tests.fakes.remote import FakeHost, FakeServe, ok_json, serve_handler

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
THREE = ("name: three\nsteps:\n  - {at: 0s, rate: 10mbit}\n  - {at: 250ms, rate: 20mbit}\n"
         "  - {at: 500ms, rate: 30mbit}\n")


class Agent:
    """A host's `netbench node` over FakeHost: rate-only (tbf), remembers what it holds.
    `serving`: it has `node serve` (FakeServe channels in `serves`); else an older netbench."""

    def __init__(self, name: str, barrier: threading.Barrier | None = None, serving: bool = False) -> None:
        self.name = name
        self.rate: int | None = None
        self.applies: list[tuple[str, list]] = []  # (command, plan): `node apply`s
        self.barrier = barrier
        self.serves: list[FakeServe] = []
        self.host = FakeHost(name, [(" info ", ok_json({"interfaces": {"eth1": ["10.9.0.1/24"]}, "interface_ok": True,
                                                        "backend": "userspace", "backend_reason": "no sch_netem"})),
                                    (" apply ", self.apply), (" show ", self.show),
                                    ("netbench.state.lease renew", CommandResult(0, "", ""))],
                             streams=[(" serve", self.serve)] if serving else [])

    def apply(self, command: str, input: str | None) -> CommandResult:
        plan = wire.plan_from_json(input)
        self.applies.append((command, plan))
        return ok_json({"applied": self.make(plan)})

    def serve(self, command: str) -> FakeServe:
        stream = FakeServe(serve_handler(lambda request: {"applied": self.make(
            wire.plan_from_json(json.dumps(request["plan"])))}))
        self.serves.append(stream)
        return stream

    def make(self, plan: list) -> list[str]:
        if self.barrier is not None:
            self.barrier.wait()  # every host's change is in flight at once, or this breaks
        tbfs = [c for c in plan if isinstance(c, ch.SetTbf)]
        self.rate = tbfs[-1].rate_bps if tbfs else None
        return [c.describe() for c in plan]

    def show(self, command: str, input: str | None) -> CommandResult:
        profile = {"name": "read-back", "rate": units.format_rate_bps(self.rate)} if self.rate else None
        row = {"node": self.name, "backend": "userspace" if self.rate else None, "qdisc": None, "engine": None,
               "profile": profile}
        return ok_json({"host": self.name, "interface": "eth1", "nodes": [row], "lease": {"held": False},
                        "watchers": [], "pending": []})


@pytest.fixture(params=[False], ids=["node-apply"])
def agents(monkeypatch, tmp_path, request):
    barrier = threading.Barrier(2, timeout=10)
    made = [Agent("a", barrier, request.param), Agent("b", barrier, request.param)]
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
    (tmp_path / "three.yaml").write_text(THREE + "  - {at: 750ms, delay: 5ms}\n")
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


# ---------------------------------------------------------------- through `node serve`

@pytest.mark.parametrize("agents", [True], ids=["serve"], indirect=True)
def test_the_schedule_goes_through_one_node_serve_per_host(agents):
    result = invoke()
    assert result.exit_code == 0, result.output
    assert "schedule: 3 change(s), lateness mean" in result.output
    for agent in agents:
        assert agent.applies == [] and agent.host.ran(" apply ") == []  # no `node apply` process per change
        (stream,) = agent.serves  # one `node serve` for the whole schedule
        assert stream.ops() == ["ping", "apply", "apply", "apply", "apply", "bye"]
        applies = [r for r in stream.requests if r["op"] == "apply"]
        rates = [next(c["rate_bps"] for c in r["plan"]["changes"] if c["type"] == "SetTbf") for r in applies]
        assert rates == [10_000_000, 20_000_000, 30_000_000, 30_000_000]  # the last again, releasing the lease
        assert [r["lease_s"] for r in applies] == [60, 60, 60, 0]
        assert len({r["holder"] for r in applies}) == 1 and not any(r["force"] or r["takeover"] for r in applies)
        assert stream.stdin_closed and stream.closed and agent.rate == 30_000_000
        (command, _), = agent.host.started
        assert "node --state-dir" in command and command.endswith(" serve")


@pytest.mark.parametrize("agents", [True], ids=["serve"], indirect=True)
def test_ctrl_c_restores_through_the_channel_then_closes_it(agents, monkeypatch):
    real = runner.run_schedule

    def interrupted(timeline, apply, **kwargs):
        real(timeline[:2], apply, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_schedule", interrupted)
    result = invoke()
    assert result.exit_code == 130, result.output
    for agent in agents:
        (stream,) = agent.serves
        assert stream.ops() == ["ping", "apply", "apply", "apply", "bye"] and stream.closed
        restore = stream.requests[-2]
        assert restore["lease_s"] == 0 and not any(c["type"] == "SetTbf" for c in restore["plan"]["changes"])
        assert agent.rate is None and agent.applies == []


def test_a_host_without_node_serve_gets_node_apply_per_change(monkeypatch, tmp_path):
    barrier = threading.Barrier(2, timeout=10)
    new, old = Agent("a", barrier, serving=True), Agent("b", barrier, serving=False)
    monkeypatch.setattr(remote, "open_inventory", lambda path, insecure: (INV, [new.host, old.host]))
    monkeypatch.setattr(common, "sigterm_as_interrupt", lambda: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "three.yaml").write_text(THREE)
    result = invoke()
    assert result.exit_code == 0, result.output
    assert new.applies == [] and new.serves[0].ops().count("apply") == 4
    (command, refused), = old.host.started  # its netbench has no `serve`: the shell says 127, no reply
    assert command.endswith(" serve") and refused.input and json.loads(refused.input[0])["op"] == "ping"
    assert [c.split("--lease ")[1].split()[0] for c, _ in old.applies] == ["60", "60", "60", "0"]
    assert new.rate == old.rate == 30_000_000
