"""--congestion-control: the name's checks, the playbook key and its fingerprint, setting it on
the nodes journaled and putting it back (on an in-memory sysctl table that refuses as Linux
does), and the hosts target's refusal."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from netbench.errors import TestbedError, UsageError
from netbench.model import congestion as cc, design
from netbench.model.job import JobSpec
from netbench.model.design import expand
from netbench.model.playbook import PlaybookError, playbook_from_mapping
from netbench.model.topology import Node
from netbench.state.journal import Journal
from netbench.state.reset import reset
from netbench.testbed import congestion, netns as local


# ---------------------------------------------------------------- pure

def test_a_name_is_lower_case_letters_digits_and_underscores_of_at_most_15():
    assert cc.check_name("cubic") is None and cc.check_name("bbr") is None and cc.check_name("tcp_nv") is None
    for bad in ("", "Cubic", "cu bic", "cubic;reboot", "a" * 16, "1cubic", "../x"):
        assert "is not a congestion control's name" in cc.check_name(bad), bad


def test_a_name_the_kernel_does_not_have_is_refused_naming_the_available_ones():
    assert cc.refusal("cubic", ["reno", "bbr", "cubic"]) is None
    assert cc.refusal("vegas", ["reno", "bbr", "cubic"]) == \
        "vegas is not available on this machine (available: reno bbr cubic)"
    assert "not a congestion control's name" in cc.refusal("Vegas", ["reno"])


def test_the_allowed_list_is_widened_only_when_a_namespace_may_not_choose_the_name():
    assert cc.widened(["reno", "bbr"], "bbr") is None
    assert cc.widened(["reno", "bbr"], "cubic") == "reno bbr cubic"


def test_the_line_says_what_the_nodes_use_and_that_netbench_set_it():
    assert cc.describe({"n1": "cubic", "n2": "cubic"}) == "TCP congestion control on every node: cubic"
    assert cc.describe({"n1": "cubic", "n2": "cubic"}, "cubic") == \
        "TCP congestion control on every node: cubic (asked for this sweep: cubic)"
    assert cc.describe({"n1": "cubic", "n2": "bbr"}, "cubic").startswith("TCP congestion control: n1 cubic, n2 bbr")


# ---------------------------------------------------------------- playbooks

def _book(**extra):
    return playbook_from_mapping({"factors": {"latency": ["1ms", "2ms"]}, **extra}, "p.yaml")


def test_the_playbook_key_is_checked_at_load():
    assert _book(congestion_control="cubic").congestion_control == "cubic"
    assert _book().congestion_control is None
    with pytest.raises(PlaybookError, match=r"p.yaml: congestion_control: 'Cu bic' is not a congestion"):
        _book(congestion_control="Cu bic")
    with pytest.raises(PlaybookError, match=r"p.yaml: congestion_control: must be a name, got 3"):
        _book(congestion_control=3)


def test_the_congestion_control_is_part_of_the_fingerprint_only_when_set():
    plain, cubic, bbr = _book(), _book(congestion_control="cubic"), _book(congestion_control="bbr")
    digests = {design.design_digest(b, expand(b, 3)) for b in (plain, cubic, bbr)}
    assert len(digests) == 3
    # unset, nothing is added: a folder written before the key existed keeps its digest
    assert "congestion_control" not in design._measurement_record(plain)
    assert "congestion_control" not in design.plan_record(plain, 3, expand(plain, 3))
    assert design.plan_record(cubic, 3, expand(cubic, 3))["congestion_control"] == "cubic"
    record = design.plan_record(cubic, 3, expand(cubic, 3))
    with pytest.raises(PlaybookError, match="its congestion control was cubic, now bbr"):
        design.check_resume(bbr, expand(bbr, 3), record, "out", has_runs=True)
    with pytest.raises(PlaybookError, match="its congestion control was the nodes' own, now cubic"):
        design.check_resume(cubic, expand(cubic, 3), design.plan_record(plain, 3, expand(plain, 3)), "out",
                            has_runs=True)


# ---------------------------------------------------------------- the flag

def test_the_flag_refuses_a_bad_name_before_anything_runs():
    from netbench.cli.app import main as cli

    result = CliRunner().invoke(cli, ["sweep", "--latency", "1ms", "--congestion-control", "Cu bic", "--dry-run"])
    assert result.exit_code == 2 and "--congestion-control" in result.output and "not a congestion" in result.output


def test_the_hosts_target_refuses_it():
    from netbench.experiment.runner import SweepConfig
    from netbench.testbed.hosts import refuse_schedules

    runs = design.sweep_runs((), 1, JobSpec(), 2)
    config = SweepConfig(sweep_id="s", runs=runs, job=JobSpec(), workers=2, output=None, congestion_control="cubic")
    with pytest.raises(UsageError, match="--congestion-control is embedded-only for now"):
        refuse_schedules(config)


# ---------------------------------------------------------------- setting it, journaled

class FakeSysctl:
    """net.ipv4's congestion sysctls per namespace (None: the host), refusing as Linux does: a
    namespace may choose only an allowed algorithm (the host's list), nobody an unavailable one."""

    def __init__(self, namespaces=("netbench-n1", "netbench-n2"), default="bbr", allowed="reno bbr",
                 fail_in: str | None = None):
        self.values = {None: {cc.DEFAULT_KEY: default, cc.ALLOWED_KEY: allowed,
                              cc.AVAILABLE_KEY: "reno bbr cubic"}}
        for name in namespaces:
            self.values[name] = {cc.DEFAULT_KEY: default}
        self.fail_in = fail_in
        self.writes: list[tuple] = []

    def read(self, key, name=None):
        table = self.values.get(name, {})
        return table.get(key, self.values[None].get(key, ""))

    def write(self, key, value, name=None):
        self.writes.append((name, key, value))
        if key == cc.DEFAULT_KEY and value not in self.read(cc.AVAILABLE_KEY).split():
            raise TestbedError(f"cannot set {key}={value}: No such file or directory")
        if (name is not None and name == self.fail_in) or (name is not None and key == cc.DEFAULT_KEY
                                    and value not in self.read(cc.ALLOWED_KEY).split()):
            raise TestbedError(f"cannot set {key}={value} in {name}: Operation not permitted")
        self.values[name][key] = value


@pytest.fixture
def sysctl(monkeypatch):
    table = FakeSysctl()
    monkeypatch.setattr(local, "read_sysctl", table.read)
    monkeypatch.setattr(local, "write_sysctl", table.write)
    monkeypatch.setattr(congestion.pnetns, "listnetns", lambda: [n for n in table.values if n])
    monkeypatch.setattr("netbench.state.reset.pnetns.listnetns", lambda: [n for n in table.values if n])
    monkeypatch.setattr(local, "stale_scratch_netns", lambda: [])
    monkeypatch.setattr(local, "list_netbench_netns", lambda: [])
    monkeypatch.setattr(local, "host_netns_references", lambda: [])
    return table


NODES = (Node("n1", "netbench-n1", "eth0", "10.0.0.1", 24, "nb-n1"),
         Node("n2", "netbench-n2", "eth0", "10.0.0.2", 24, "nb-n2"))


def test_every_node_gets_it_journaled_and_gets_its_own_back(sysctl, tmp_path):
    journal = Journal(tmp_path)
    entries = congestion.set_on_nodes(journal, NODES, "cubic")
    # cubic is not on the host's allowed list: widened first, then each node
    assert [(e.data["netns"], e.data["key"], e.data["previous"]) for e in entries] == [
        (None, cc.ALLOWED_KEY, "reno bbr"), ("netbench-n1", cc.DEFAULT_KEY, "bbr"),
        ("netbench-n2", cc.DEFAULT_KEY, "bbr")]
    assert [e.kind for e in journal.pending()] == ["sysctl"] * 3
    assert sysctl.read(cc.DEFAULT_KEY, "netbench-n1") == sysctl.read(cc.DEFAULT_KEY, "netbench-n2") == "cubic"
    lines = congestion.restore(journal, entries)
    assert len(lines) == 3 and journal.pending() == []
    assert sysctl.read(cc.DEFAULT_KEY, "netbench-n1") == "bbr" and sysctl.read(cc.ALLOWED_KEY) == "reno bbr"


def test_an_allowed_name_leaves_the_host_alone_and_a_node_that_has_it_is_not_touched(sysctl, tmp_path):
    sysctl.values["netbench-n2"][cc.DEFAULT_KEY] = "reno"
    entries = congestion.set_on_nodes(Journal(tmp_path), NODES, "reno")
    assert [e.data["netns"] for e in entries] == ["netbench-n1"]
    assert all(name is not None for name, _, _ in sysctl.writes)


def test_a_node_that_refuses_puts_back_what_was_set_and_leaves_no_entry(sysctl, tmp_path):
    sysctl.fail_in = "netbench-n2"
    journal = Journal(tmp_path)
    with pytest.raises(TestbedError, match="netbench-n2: Operation not permitted"):
        congestion.set_on_nodes(journal, NODES, "cubic")
    assert journal.pending() == []
    assert sysctl.read(cc.DEFAULT_KEY, "netbench-n1") == "bbr" and sysctl.read(cc.ALLOWED_KEY) == "reno bbr"


def test_reset_puts_it_back_after_a_crash(sysctl, tmp_path):
    journal = Journal(tmp_path)
    congestion.set_on_nodes(journal, NODES, "cubic")  # and the controller is killed: nothing restored
    del sysctl.values["netbench-n2"]  # a namespace gone meanwhile takes its value with it
    removed = reset(journal)
    assert f"{cc.DEFAULT_KEY} change in netbench-n1 (back to 'bbr')" in removed, removed
    assert f"{cc.ALLOWED_KEY} change on the host (back to 'reno bbr': 'cubic' taken out)" in removed, removed
    assert sysctl.read(cc.DEFAULT_KEY, "netbench-n1") == "bbr" and sysctl.read(cc.ALLOWED_KEY) == "reno bbr"
    assert journal.pending() == [] and reset(journal) == []


def test_an_unavailable_name_is_refused_naming_the_flag_and_nothing_is_written(sysctl, monkeypatch):
    monkeypatch.setattr(congestion.proc, "run", lambda *a, **k: None)  # modprobe: loads nothing
    with pytest.raises(UsageError, match=r"^flag --congestion-control: vegas is not available on this machine "
                                         r"\(available: reno bbr cubic\)$"):
        congestion.check_available("vegas", "flag --congestion-control")
    congestion.check_available("cubic", "flag --congestion-control")
    assert sysctl.writes == []


@pytest.mark.parametrize("after_a_crash", [False, True])
def test_putting_the_allowed_list_back_takes_out_only_the_name_netbench_added(sysctl, tmp_path, after_a_crash):
    """Another tool allows vegas while the sweep runs: the sweep's end (or reset after a crash)
    takes cubic out and leaves vegas, never writing back the list as it was before the sweep."""
    sysctl.values[None][cc.AVAILABLE_KEY] += " vegas"
    journal = Journal(tmp_path)
    entries = congestion.set_on_nodes(journal, NODES, "cubic")
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr cubic"
    sysctl.values[None][cc.ALLOWED_KEY] = "reno bbr cubic vegas"
    lines = reset(journal) if after_a_crash else congestion.restore(journal, entries)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr vegas"
    assert f"{cc.ALLOWED_KEY} change on the host (back to 'reno bbr vegas': 'cubic' taken out)" in lines, lines
    assert journal.pending() == []


def test_an_allowed_list_someone_else_already_narrowed_is_left_alone(sysctl, tmp_path):
    journal = Journal(tmp_path)
    entries = congestion.set_on_nodes(journal, NODES, "cubic")
    sysctl.values["netbench-n1"][cc.DEFAULT_KEY] = sysctl.values["netbench-n2"][cc.DEFAULT_KEY] = "bbr"
    sysctl.values[None][cc.ALLOWED_KEY] = "bbr"
    sysctl.writes.clear()
    congestion.restore(journal, entries)
    assert sysctl.writes == [] and sysctl.read(cc.ALLOWED_KEY) == "bbr"


@pytest.mark.parametrize("allowed, added, expected", [
    (["reno", "bbr", "cubic"], "cubic", "reno bbr"), (["cubic", "reno"], "cubic", "reno"),
    (["reno", "bbr"], "cubic", None), (["cubic"], "cubic", ""),
])
def test_narrowed(allowed, added, expected):
    assert cc.narrowed(allowed, added) == expected


# ---------------------------------------------------------------- two sweeps at once

NODES_B = (Node("n1", "netbench-b-n1", "eth0", "10.1.0.1", 24, "nb-b-n1"),
           Node("n2", "netbench-b-n2", "eth0", "10.1.0.2", 24, "nb-b-n2"))


@pytest.fixture
def two_testbeds(sysctl):
    for node in NODES_B:
        sysctl.values[node.netns] = {cc.DEFAULT_KEY: "bbr"}
    return sysctl


def test_two_sweeps_that_widen_the_allowed_list_at_once_keep_it_until_the_last_is_done(two_testbeds, tmp_path):
    """Sweeps A and B (two state folders, two journals) both set cubic, which the host's
    allowed list lacks. A finishes first: cubic stays allowed for B (the first to finish used
    to take it out); B's end takes it out. Neither writes the list twice."""
    sysctl = two_testbeds
    first, second = Journal(tmp_path / "a"), Journal(tmp_path / "b")
    a = congestion.set_on_nodes(first, NODES, "cubic")
    b = congestion.set_on_nodes(second, NODES_B, "cubic")
    assert [w for w in sysctl.writes if w[0] is None] == [(None, cc.ALLOWED_KEY, "reno bbr cubic")]
    assert b[0].data["key"] == cc.ALLOWED_KEY and b[0].data["added"] == "cubic"  # B holds it too
    congestion.restore(first, a)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr cubic"  # B still uses it
    assert sysctl.read(cc.DEFAULT_KEY, "netbench-b-n1") == "cubic" and sysctl.read(cc.DEFAULT_KEY, "netbench-n1") == "bbr"
    congestion.restore(second, b)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr"
    assert first.pending() == [] and second.pending() == []


def test_a_crashed_sweeps_hold_keeps_nothing_from_the_live_one_and_its_reset_finds_it_put_back(two_testbeds, tmp_path):
    """A widens and is killed (its hold's process gone); B starts while cubic is still allowed
    and holds it as well. B's end takes cubic out (no live netbench holds it); A's reset later
    finds nothing to put back. Had A's reset come first, B would have kept it."""
    import subprocess
    import sys

    from netbench.state.holds import Holds

    sysctl = two_testbeds
    first, second = Journal(tmp_path / "a"), Journal(tmp_path / "b")
    congestion.set_on_nodes(first, NODES, "cubic")
    b = congestion.set_on_nodes(second, NODES_B, "cubic")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holds, setting = Holds(), cc.allowed_setting("cubic")
    crashed = next(e for e in first.pending() if e.data.get("added")).data["hold"]
    holds.add(setting, crashed, pid=gone.pid)  # A's hold now names a process that has ended
    assert holds.others_live(setting) == 1  # B's
    congestion.restore(second, b)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr"
    reset(first)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr" and first.pending() == [] and not holds.held(setting)


def test_a_reset_of_one_sweep_leaves_the_name_to_a_live_one(two_testbeds, tmp_path):
    sysctl = two_testbeds
    first, second = Journal(tmp_path / "a"), Journal(tmp_path / "b")
    congestion.set_on_nodes(first, NODES, "cubic")
    b = congestion.set_on_nodes(second, NODES_B, "cubic")
    warnings: list[str] = []
    reset(first, warn=warnings.append)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr cubic"
    assert any("'cubic' left in: 1 other netbench(s) still use it" in w for w in warnings), warnings
    congestion.restore(second, b)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr"


def test_a_name_on_the_hosts_own_list_is_never_held_nor_taken_out(two_testbeds, tmp_path):
    sysctl = two_testbeds
    for journal, nodes in ((Journal(tmp_path / "a"), NODES), (Journal(tmp_path / "b"), NODES_B)):
        entries = congestion.set_on_nodes(journal, nodes, "reno")
        assert all(e.data["netns"] is not None for e in entries)
        congestion.restore(journal, entries)
    assert sysctl.read(cc.ALLOWED_KEY) == "reno bbr"
