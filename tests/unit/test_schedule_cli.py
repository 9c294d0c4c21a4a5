"""`netbench apply --schedule` on the embedded Target over the fake kernel adapters: dry run,
a run to the end, Ctrl-C putting the link back, and refusals."""

from __future__ import annotations

import contextlib
import ipaddress

import pytest
from click.testing import CliRunner
from tests.fakes.netlink import make_fakes

from netbench.cli import common, emulation, schedule_apply
from netbench.cli.app import main
from netbench.experiment import schedule as runner
from netbench.model.topology import plan_topology
from netbench.state.journal import Journal
from netbench.testbed.embedded import EmbeddedTestbed

TOPO = plan_topology(2, ipaddress.ip_network("10.214.0.0/24"))
QUICK = "name: quick\nsteps:\n  - {at: 0s, delay: 5ms}\n  - {at: 10ms, delay: 30ms}\n  - {at: 20ms, rate: 50mbit}\n"


@pytest.fixture
def target(monkeypatch, tmp_path):
    qdiscs, iptables, engines, _ = make_fakes()
    testbed = EmbeddedTestbed(Journal(tmp_path / "state"), adapters=(qdiscs, iptables, engines),
                              discover=lambda: TOPO, probe=lambda: (True, "sch_netem (fake)"))

    @contextlib.contextmanager
    def open_target(inventory=None, insecure_host_keys=False, **kwargs):
        yield testbed

    monkeypatch.setattr(emulation, "open_target", open_target)
    monkeypatch.setattr(schedule_apply, "open_target", open_target)
    monkeypatch.setattr(common, "require_root", lambda: None)
    monkeypatch.setattr(common, "require_testbed", lambda *a: None)
    monkeypatch.setattr(common, "sigterm_as_interrupt", lambda: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick.yaml").write_text(QUICK)
    return testbed


def invoke(*args):
    return CliRunner().invoke(main, list(args), terminal_width=300)


def held(testbed) -> list:
    return [row["profile"] for row in testbed.show()["nodes"]]


def test_dry_run_prints_the_timeline_and_changes_nothing(target):
    result = invoke("apply", "--schedule", "quick.yaml", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "dry run" in result.output
    for line in ("0s  step 1: delay 5ms -> quick@0s", "0.01s  step 2: delay 30ms -> quick@0.01s",
                 "0.02s  step 3: rate 50mbit -> quick@0.02s (30ms/50mbit/0%)"):
        assert line in result.output, result.output
    assert held(target) == [None, None]


def test_a_run_prints_each_change_and_leaves_the_last_applied(target):
    result = invoke("apply", "--schedule", "quick.yaml")
    assert result.exit_code == 0, result.output
    for name in ("quick@0s", "quick@0.01s", "quick@0.02s"):
        assert name in result.output
    assert "late" in result.output and "schedule: 3 change(s), lateness mean" in result.output
    assert {p["delay"] for p in held(target)} == {"30ms"} and {p["rate"] for p in held(target)} == {"50mbit"}


def test_ctrl_c_puts_the_link_back_as_it_was_and_exits_130(target, monkeypatch):
    assert invoke("apply", "--latency", "7ms").exit_code == 0
    before = held(target)
    real = runner.run_schedule

    def interrupted(timeline, apply, **kwargs):
        real(timeline[:2], apply, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_schedule", interrupted)
    result = invoke("apply", "--schedule", "quick.yaml")
    assert result.exit_code == 130, result.output
    assert "quick@0.01s" in result.output and "restored the link as it was" in result.output
    assert "schedule: 2 change(s)" in result.output
    assert held(target) == before


def test_ctrl_c_on_an_unshaped_link_clears_it(target, monkeypatch):
    def interrupted(timeline, apply, **kwargs):
        apply(timeline[0].profile)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_schedule", interrupted)
    assert invoke("apply", "--schedule", "quick.yaml").exit_code == 130
    assert held(target) == [None, None]


@pytest.mark.parametrize("extra, named", [(["quick.yaml"], "PROFILE_FILE"), (["--latency", "5ms"], "--latency"),
                                          (["--loss", "1%", "--bandwidth", "1mbit"], "--bandwidth, --loss")])
def test_schedule_with_a_profile_is_one_line_naming_the_flags(target, extra, named):
    result = invoke("apply", "--schedule", "quick.yaml", *extra)
    assert result.exit_code == 2
    first = result.output.splitlines()[0]
    assert first.startswith("error: flag --schedule: not with") and named in first, result.output


def test_a_bad_schedule_changes_nothing(target, tmp_path):
    (tmp_path / "bad.yaml").write_text("steps:\n  - {at: 0s, delay: 5ms}\n  - {at: 1s, dleay: 6ms}\n")
    result = invoke("apply", "--schedule", "bad.yaml")
    assert result.exit_code == 2
    assert "bad.yaml: step 2: dleay: unknown key" in result.output
    assert held(target) == [None, None]


def test_a_training_step_schedule_is_refused_before_any_change(target, tmp_path):
    (tmp_path / "steps.yaml").write_text("steps:\n  - {at_step: 5, delay: 5ms}\n")
    for dry_run in (["--dry-run"], []):  # a dry run refuses what the run would refuse
        result = invoke("apply", "--schedule", "steps.yaml", *dry_run)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: steps.yaml: at_step: a schedule of training steps runs within a sweep")
        assert "dry run" not in result.output
    assert held(target) == [None, None]
