"""docs/guide/troubleshooting.md shows what netbench prints for the ten errors users meet first:
each message shown there is made here by the code that prints it (on fakes, as a normal user,
loopback only) and compared by its shape (numbers and padding may differ, words may not)."""

from __future__ import annotations

import os
import re
import socket
import threading

import pytest
from click.testing import CliRunner
from rich.text import Text

from netbench import console
from netbench.cli import app as cli
from netbench.cli import common
from netbench.errors import NetbenchError
from tests import readme_examples as rx
from tests.conftest import ROOT
from tests.unit.rootless_fakes import no_userns

PAGE = (ROOT / "docs" / "guide" / "troubleshooting.md").read_text()


def shown(section: str) -> list[str]:
    """The lines of the first text block under the page's heading `section`."""
    part = PAGE.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return part.split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()


def test_the_page_has_the_ten_sections():
    sections = re.findall(r"^## (.+)$", PAGE, re.M)
    assert sections == ["No root", "No netem", "A busy testbed", "A unit refused", "A precision not reached",
                        "A straggler", "A job that never steps", "A port in use", "An SSH host unreachable",
                        "A left-over after a crash"]


def printed(error: NetbenchError, capsys) -> str:
    """What the CLI prints for a library error (cli/common.py's handle_errors)."""
    capsys.readouterr()
    console.error(error.message, error.hint)
    return capsys.readouterr().err


def plain(markup: str) -> str:
    return Text.from_markup(markup).plain


def same_shape(section: str, output: str) -> None:
    problems = rx.output_problems(shown(section), output)
    assert not problems, f"troubleshooting.md, {section}: {problems}\nprinted:\n{output}"


@pytest.fixture
def user(monkeypatch, tmp_path):
    """A normal user, a state folder of the test's own, a scratch working folder."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)


def invoke(*args):
    return CliRunner().invoke(cli.main, list(args))


def test_no_root(user, monkeypatch):
    no_userns(monkeypatch)  # a host that allows a user no namespace of their own
    result = invoke("apply", "--latency", "10ms")
    assert result.exit_code == 3
    same_shape("No root", result.stderr)


def test_no_netem(capsys):
    from netbench.emulation.backends import BACKENDS
    from netbench.model.profile import Profile

    profile = Profile(name="lossy", delay_us=20_000, jitter_us=5_000, distribution="pareto", reorder=0.25)
    with pytest.raises(NetbenchError) as caught:
        BACKENDS["userspace"].refuse(profile, "")
    same_shape("No netem", printed(caught.value, capsys))


def test_a_busy_testbed(user, monkeypatch, tmp_path):
    from netbench.state import reset as reset_module
    from netbench.state.journal import Lock

    from netbench.cli import emulation

    monkeypatch.setattr(os, "geteuid", lambda: 0)  # root's default testbed, its lock held
    monkeypatch.setattr(emulation, "_reset_sandboxes", lambda include_default: [])
    monkeypatch.setattr(reset_module, "reset", lambda journal, **kwargs: [])
    with Lock(tmp_path / "state"):
        result = invoke("reset")
    assert result.exit_code == 1
    same_shape("A busy testbed", result.stderr)


def test_a_unit_refused(user):
    result = invoke("sweep", "--bandwidth", "100mbps", "--dry-run")
    assert result.exit_code == 2
    same_shape("A unit refused", result.stderr)


def test_a_precision_not_reached():
    from types import SimpleNamespace

    from netbench.cli.render import capped_line

    def run(run_id, reached, ci):
        return SimpleNamespace(run_id=run_id, status="ok", precision_reached=reached, step_time_ci_pct=ci)

    job = SimpleNamespace(precision=0.03, max_seconds=60.0)
    line = capped_line([run("r002", True, 0.4), run("r001", True, 2.6), run("r000", False, 3.7)], job)
    same_shape("A precision not reached", plain(line))


def test_a_straggler():
    from netbench.jobs.stragglers import SYNC, sentence

    record = {"mode": SYNC, "straggler": 1, "straggler_node": "n2", "straggler_share": 0.96, "wait_share": 0.44}
    same_shape("A straggler", sentence(record))


def test_a_job_that_never_steps(tmp_path):
    from netbench.experiment.runner import SweepConfig, run_sweep
    from netbench.jobs.launch import Timeouts
    from netbench.model import design
    from netbench.model.job import JobSpec
    from netbench.model.profile import Profile
    from netbench.state.journal import Journal
    from tests.fakes.sweep import SyntheticTestbed
    from tests.unit.test_link_bytes import Silent

    class NeverSteps(SyntheticTestbed):
        def spawn(self, task, log, env):
            self.spawned.append(task)
            return Silent()

    job = JobSpec(warmup=1, steps=3)
    runs = design.plan_sweep(Profile(name="d1ms", delay_us=1000), design.SweepLevels(), 1, job, 2)
    config = SweepConfig(sweep_id="s", runs=tuple(runs), job=job, workers=2, output=tmp_path / "out",
                         timeouts=Timeouts(startup_s=0.5))
    [result] = run_sweep(config, testbed=NeverSteps(Journal(tmp_path / "state")))
    assert result.status == "timeout"
    (line,) = shown("A job that never steps")
    assert rx.output_problems([line.split("): ", 1)[1]], f"{result.status}: {result.error}") == []


def test_a_port_in_use(tmp_path, capsys):
    from netbench.metrics.exporter import MetricsExporter

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        exporter = MetricsExporter(busy.getsockname()[1], state_path=tmp_path)
        with pytest.raises(NetbenchError) as caught:
            exporter.start()
    same_shape("A port in use", printed(caught.value, capsys))


def test_an_ssh_host_unreachable(tmp_path, capsys):
    """A host whose port no one listens on (loopback): the connection is refused at once."""
    from netbench.remote.inventory import Host, Inventory
    from netbench.remote.ssh import FabricHost

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "ssh_config").write_text("")
    inventory = Inventory(path=str(tmp_path / "hosts.yaml"), hosts=(), ssh_config=str(tmp_path / "ssh_config"))
    host = FabricHost(Host(name="gpu1", ssh="127.0.0.1", user="root", port=port, interface="eth1", agent=False),
                      inventory)
    errors: list[BaseException] = []
    opening = threading.Thread(target=lambda: _open(host, errors), daemon=True)
    opening.start()
    opening.join(30)
    (error,) = errors
    text = printed(error, capsys)
    shown_error, shown_hint = shown("An SSH host unreachable")
    made_error, made_hint = text.splitlines()
    name, _, rest = re.match(r"error: host (\S+) \((.+?)\): (.*)", shown_error).groups()
    made = re.match(rf"error: host {name} \(root@127\.0\.0\.1:{port}\): (.*)$", made_error)
    assert made and rx.normalized(made.group(1)) == rx.normalized(rest), made_error
    assert made_hint == shown_hint


def _open(host, errors: list) -> None:
    try:
        host._open()
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        errors.append(exc)


def test_a_left_over_after_a_crash(user, monkeypatch):
    from netbench.testbed import netns as local

    monkeypatch.setattr(os, "geteuid", lambda: 0)  # root's default testbed, left over in /run/netns
    monkeypatch.setattr(local, "list_netbench_netns", lambda: ["netbench-sw", "netbench-n1", "netbench-n2"])
    result = invoke("testbed", "up", "--nodes", "2")
    assert result.exit_code == 1
    same_shape("A left-over after a crash", result.stderr)
