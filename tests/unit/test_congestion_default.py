"""The embedded nodes' congestion control by default (cubic, not the host's inherited one),
`--congestion-control host` to keep the host's, and every run's congestion control recorded."""

from __future__ import annotations

import csv

import pytest

from netbench.errors import UsageError
from netbench.model import congestion as cc
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.model.run import Run
from netbench.state.journal import Journal


def test_the_embedded_default_is_cubic_unless_a_sweep_names_one():
    assert cc.EMBEDDED_DEFAULT == "cubic"
    assert cc.embedded_choice(None, ["reno", "bbr", "cubic"]) == ("cubic", True)
    assert cc.embedded_choice("bbr", ["reno", "bbr", "cubic"]) == ("bbr", False)
    assert cc.embedded_choice("host", ["reno", "bbr", "cubic"]) == (None, False)  # the inherited one
    assert cc.embedded_choice(None, ["reno", "bbr"]) == (None, False)  # a kernel without cubic: the nodes' own


def test_the_sweep_line_and_the_dry_run_say_where_the_congestion_control_came_from():
    nodes = {"n1": "cubic", "n2": "cubic"}
    assert cc.describe(nodes, None, "cubic") == ("TCP congestion control on every node: cubic (netbench's default "
                                                 "for the embedded nodes; --congestion-control NAME sets another, "
                                                 "'host' keeps the host's)")
    assert cc.describe({"n1": "bbr"}, "host").endswith("(the host's default, as asked: --congestion-control host)")
    assert cc.describe(nodes, "cubic").endswith("(asked for this sweep: cubic)")
    assert cc.describe({"n1": "bbr"}) == "TCP congestion control on every node: bbr"  # the hosts' own
    assert cc.plan_line(None).startswith("TCP congestion control cubic on every node for the sweep (the embedded default")
    assert cc.plan_line("bbr", "session").startswith("TCP congestion control bbr on every node for the session, the")
    assert "host's default" in cc.plan_line("host")


@pytest.fixture
def kernel(monkeypatch):
    """The embedded testbed's view of the kernel's algorithms; `checked` lists what it asked."""
    from netbench.testbed import congestion

    state = {"available": ["reno", "bbr", "cubic"], "checked": []}

    def check_available(name, where):
        state["checked"].append(name)
        if name not in state["available"]:
            raise UsageError(f"{where}: {name} is not available on this machine")

    monkeypatch.setattr(congestion, "available", lambda: list(state["available"]))
    monkeypatch.setattr(congestion, "check_available", check_available)
    return state


def embedded(tmp_path):
    from netbench.testbed.embedded import EmbeddedTestbed

    return EmbeddedTestbed(Journal(tmp_path))


def test_the_embedded_testbed_sets_cubic_by_default_and_what_it_is_asked_otherwise(kernel, tmp_path):
    bed = embedded(tmp_path)
    bed._choose_congestion(None)
    assert (bed.congestion, bed.congestion_default) == ("cubic", "cubic")
    bed._choose_congestion("bbr")
    assert (bed.congestion, bed.congestion_default) == ("bbr", None) and kernel["checked"][-1] == "bbr"
    kernel["checked"].clear()
    bed._choose_congestion("host")
    assert (bed.congestion, bed.congestion_default) == (None, None) and kernel["checked"] == []
    with pytest.raises(UsageError, match="vegas is not available"):
        bed._choose_congestion("vegas")
    kernel["available"] = ["reno", "bbr"]  # no cubic, even after trying its module: the nodes keep their own
    bed._choose_congestion(None)
    assert (bed.congestion, bed.congestion_default) == (None, None)


def test_host_is_allowed_with_an_inventory_and_other_names_are_not():
    from netbench.experiment.runner import SweepConfig
    from netbench.testbed.hosts import refuse_schedules

    runs = (Run(index=0, profile=Profile(name="p"), repeat=0, job=JobSpec(), workers=2),)
    refuse_schedules(SweepConfig(sweep_id="s", runs=runs, job=JobSpec(), workers=2, output=None,
                                 congestion_control="host"))
    with pytest.raises(UsageError, match="embedded-only"):
        refuse_schedules(SweepConfig(sweep_id="s", runs=runs, job=JobSpec(), workers=2, output=None,
                                     congestion_control="cubic"))


def test_every_run_records_the_nodes_congestion_control(tmp_path):
    from tests.fakes.sweep import SyntheticTestbed

    from netbench.experiment.runner import SweepConfig, run_sweep

    class Reporting(SyntheticTestbed):
        congestion_default = "cubic"

        def congestion_control(self):
            return {node.name: "cubic" for node in self.topology.nodes}

    notes: list[str] = []

    class Observer:
        def __getattr__(self, name):
            return (lambda text: notes.append(text)) if name == "note" else (lambda *args: None)

    job = JobSpec(warmup=1, steps=3)
    runs = tuple(Run(index=i, profile=Profile(name=f"d{i}", delay_us=1000 * (i + 1)), repeat=0, job=job, workers=2)
                 for i in range(2))
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out", isolate=True)
    results = run_sweep(config, Observer(), testbed=Reporting(Journal(tmp_path / "state")))
    assert [r.congestion_control for r in results] == ["cubic", "cubic"]
    assert any("cubic (netbench's default for the embedded nodes" in n for n in notes), notes
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        assert [row["congestion_control"] for row in csv.DictReader(fh)] == ["cubic", "cubic"]
